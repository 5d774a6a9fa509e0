// Package kernels holds the CUDA C sources of troupe's GPU kernels and the
// artifacts built from them: for each module cuda/NAME.cu, a cubin for
// Hopper (sm_90a) and PTX for compute capability 8.0 and later, embedded in
// the binary. build.sh rebuilds the artifacts on a host with nvcc and
// records in manifest.json a hash of each module's sources and flags; a
// test without a GPU fails when a source changed and its artifacts did not.
//
// The package is data only: gpu/cuda loads the modules and launches the
// kernels. It imports nothing above the standard library.
package kernels
