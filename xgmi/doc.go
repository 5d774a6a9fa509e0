// Package xgmi is the data plane: it moves tensors between the actors that
// own devices, so that tensors never ride the control bus.
//
// Host is the host-memory path, used by the CPU lane and by actors of one
// process: a stage publishes its output under a name and the next stage
// reads it in place. Stream carries the same buffers between hosts over an
// authenticated TCP connection. Collectives (Comm: all-reduce, all-gather,
// broadcast) run over a Fabric of ranks; HostFabric is the host-memory one.
// CUDAFabric joins the GPUs of one process through peer memory, and its
// DeviceComm runs the same collectives as kernels on device buffers, with
// device-side flags, so that they can be recorded in CUDA graphs
// (docs/xgmi.md; AMD's XGMI fits the same shape). NewIPCFabric joins GPUs
// of separate processes of one host the same way, through CUDA IPC
// handles that the ranks swap through an Exchange (over the bus, by the
// actors that own the devices: xgmi itself never imports the bus).
//
// Host is safe for concurrent use. A published buffer is owned by its
// publisher, which must not change it until the readers are done with the
// step that named it.
package xgmi
