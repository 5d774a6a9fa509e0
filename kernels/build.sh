#!/usr/bin/env bash
# Compiles kernels/cuda/*.cu with nvcc into the committed artifacts
#   cuda/NAME.sm_90a.cubin   machine code for Hopper (H100, H200)
#   cuda/NAME.compute_80.ptx PTX the driver compiles for any GPU from sm_80 on
# and writes manifest.json with each module's source hash: sha256 over, for
# the .cu and then every .cuh in name order, the file's name, a newline and
# its bytes, followed by "flags:" and the cubin flags, a newline, and the PTX
# flags. The test in this package recomputes the hashes without a GPU.
#
# Run on a host with the CUDA toolkit (nvcc 12.x or 13.x):
#   bash kernels/build.sh            # all modules
#   bash kernels/build.sh gemv       # one module (the manifest keeps the rest)
set -euo pipefail
cd "$(dirname "$0")"
CUBIN_FLAGS="-O3 -std=c++17 -lineinfo -gencode=arch=compute_90a,code=sm_90a -cubin"
PTX_FLAGS="-O3 -std=c++17 -gencode=arch=compute_80,code=compute_80 -ptx"
NVCC=${NVCC:-nvcc}

srchash() {
  local src=$1
  {
    for f in "cuda/$src.cu" $(ls cuda/*.cuh | LC_ALL=C sort); do
      printf '%s\n' "$(basename "$f")"
      cat "$f"
    done
    printf 'flags:%s\n%s' "$CUBIN_FLAGS" "$PTX_FLAGS"
  } | sha256sum | cut -d' ' -f1
}
filehash() { sha256sum "$1" | cut -d' ' -f1; }

mods=()
if [ $# -gt 0 ]; then mods=("$@"); else
  for f in cuda/*.cu; do mods+=("$(basename "$f" .cu)"); done
fi
# The modules compile in parallel, one nvcc pair each.
pids=()
for m in "${mods[@]}"; do
  (
    echo "nvcc $m" >&2
    $NVCC $CUBIN_FLAGS -Xptxas -v -o "cuda/$m.sm_90a.cubin" "cuda/$m.cu" 2> "${LOGDIR:-/tmp}/$m.ptxas.log" || { cat "${LOGDIR:-/tmp}/$m.ptxas.log" >&2; exit 1; }
    $NVCC $PTX_FLAGS -o "cuda/$m.compute_80.ptx" "cuda/$m.cu"
  ) &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { echo "build failed" >&2; exit 1; }

ver=$($NVCC --version | tail -n 2 | tr '\n' ' ' | sed 's/"/'"'"'/g; s/ *$//')
{
  printf '{\n  "nvcc": "%s",\n  "cubin_flags": "%s",\n  "ptx_flags": "%s",\n  "modules": [\n' "$ver" "$CUBIN_FLAGS" "$PTX_FLAGS"
  first=1
  for f in cuda/*.cu; do
    m=$(basename "$f" .cu)
    [ $first = 1 ] || printf ',\n'
    first=0
    printf '    {"name": "%s", "source": "cuda/%s.cu", "source_sha256": "%s",\n' "$m" "$m" "$(srchash "$m")"
    printf '     "cubin": "cuda/%s.sm_90a.cubin", "cubin_sha256": "%s",\n' "$m" "$(filehash "cuda/$m.sm_90a.cubin")"
    printf '     "ptx": "cuda/%s.compute_80.ptx", "ptx_sha256": "%s"}' "$m" "$(filehash "cuda/$m.compute_80.ptx")"
  done
  printf '\n  ]\n}\n'
} > manifest.json
echo "wrote manifest.json" >&2
