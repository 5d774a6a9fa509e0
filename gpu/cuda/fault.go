package cuda

import (
	"fmt"
	"sync/atomic"
)

// Fault codes kernels write to the fault word (kernels/cuda/common.cuh).
const (
	faultEmbedID     = 1
	faultStoreKVSlot = 2
	faultAttnPos     = 3
	faultAttnBlock   = 4
	faultMoEExpert   = 5
	faultCollective  = 6
)

// FaultError is a bad index a kernel refused to follow: an out-of-range
// token id, KV slot, position, block or expert that arrived in a device
// buffer. The kernel skipped the access; its output is undefined.
type FaultError struct {
	Op    string
	Code  int
	Index int // token (or routing slot) that carried the value
	Value int
}

func (e *FaultError) Error() string {
	switch e.Code {
	case faultEmbedID:
		return fmt.Sprintf("%s: id %d of token %d outside the table", e.Op, e.Value, e.Index)
	case faultStoreKVSlot:
		return fmt.Sprintf("%s: slot %d of token %d outside the cache", e.Op, e.Value, e.Index)
	case faultAttnPos:
		return fmt.Sprintf("%s: token %d at position %d (or its sequence) outside the block table", e.Op, e.Index, e.Value)
	case faultAttnBlock:
		return fmt.Sprintf("%s: token %d: block %d outside the cache", e.Op, e.Index, e.Value)
	case faultMoEExpert:
		return fmt.Sprintf("%s: routing slot %d: expert %d out of range", e.Op, e.Index, e.Value)
	case faultCollective:
		return fmt.Sprintf("%s: rank %d gave up waiting for rank %d (a rank missed the collective, or issued a different one)", e.Op, e.Index, e.Value)
	}
	return fmt.Sprintf("cuda: device fault %d (%d, %d)", e.Code, e.Index, e.Value)
}

func faultOp(code int) string {
	switch code {
	case faultEmbedID:
		return "embed"
	case faultStoreKVSlot:
		return "storekv"
	case faultAttnPos, faultAttnBlock:
		return "attention"
	case faultMoEExpert:
		return "moe"
	case faultCollective:
		return "collective"
	}
	return "cuda"
}

// takeFault reads and clears the fault word. Device's thread only, after
// a synchronisation.
func (d *Device) takeFault() error {
	if d.fault == nil {
		return nil
	}
	code := atomic.LoadUint32(&d.fault[0])
	if code == 0 {
		return nil
	}
	e := &FaultError{Op: faultOp(int(code)), Code: int(code), Index: int(int32(atomic.LoadUint32(&d.fault[1]))), Value: int(int32(atomic.LoadUint32(&d.fault[2])))}
	d.clearFault()
	return e
}

func (d *Device) clearFault() {
	if d.fault == nil {
		return
	}
	atomic.StoreUint32(&d.fault[1], 0)
	atomic.StoreUint32(&d.fault[2], 0)
	atomic.StoreUint32(&d.fault[0], 0)
}
