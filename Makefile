# Entry points for building and testing troupe. See docs/testing.md.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
# Packages are tested in parallel, one per core by default; tune with e.g. make test GOTEST_P=4.
GOTEST_P ?= $(shell nproc 2>/dev/null || echo 2)
GOTEST_TIMEOUT ?= 25m

.PHONY: test test-gpu setup vet serve

# test prepares what the tests need (Chromium, npm packages, the Jaeger
# binary; see .ci/setup), then vets and runs every test of the module with
# the race detector, in one go test invocation.
test:
	@setup_env="$$(.ci/setup)"; \
	eval "$$setup_env"; \
	echo "test: TROUPE_CHROMIUM=$${TROUPE_CHROMIUM:-<unset>}"; \
	echo "test: TROUPE_NODE_MODULES=$${TROUPE_NODE_MODULES:-<unset>}"; \
	echo "test: TROUPE_JAEGER=$${TROUPE_JAEGER:-<unset>}"; \
	echo "test: go vet ./..."; \
	$(GO) vet ./...; \
	echo "test: go test -race -p $(GOTEST_P) -timeout $(GOTEST_TIMEOUT) ./..."; \
	$(GO) test -race -p $(GOTEST_P) -timeout $(GOTEST_TIMEOUT) ./...

# setup only prepares the test dependencies and prints the environment for them.
setup:
	@.ci/setup

vet:
	$(GO) vet ./...

# test-gpu runs the GPU tier on an NVIDIA host with the CUDA toolkit installed.
test-gpu:
	$(GO) test -tags cuda -timeout $(GOTEST_TIMEOUT) ./...

serve:
	$(GO) run ./cmd/troupe serve
