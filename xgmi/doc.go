// Package xgmi is the data plane: it moves tensors between the actors that
// own devices, so that tensors never ride the control bus.
//
// Host is the host-memory path, used by the CPU lane and by actors of one
// process: a stage publishes its output under a name and the next stage
// reads it in place. Peer-memory paths between GPUs (CUDA peer access and
// IPC handles, AMD's XGMI later) and collectives build on the same naming.
//
// Host is safe for concurrent use. A published buffer is owned by its
// publisher, which must not change it until the readers are done with the
// step that named it.
package xgmi
