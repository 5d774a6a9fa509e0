package cuda

import (
	"errors"
	"fmt"
)

// CanAccessPeer reports whether d can address p's memory directly.
func (d *Device) CanAccessPeer(p *Device) (bool, error) {
	if err := d.enter("peer"); err != nil {
		return false, err
	}
	defer d.leave()
	if p == d {
		return true, nil
	}
	var v int32
	pdev := p.cudev
	err := d.do(func() error { return d.drv.cuDeviceCanAccessPeer.call(ptr(&v), uintptr(d.cudev), uintptr(pdev)) })
	if err != nil {
		return false, fmt.Errorf("cuda: peer %d -> %d: %w", d.info.Ordinal, p.info.Ordinal, err)
	}
	return v != 0, nil
}

// EnablePeerAccess lets kernels and copies on d address p's memory. It is
// idempotent; it fails when the GPUs cannot reach each other.
func (d *Device) EnablePeerAccess(p *Device) error {
	if p == d {
		return nil
	}
	ok, err := d.CanAccessPeer(p)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("cuda: peer %d -> %d: the GPUs cannot access each other", d.info.Ordinal, p.info.Ordinal)
	}
	if err := d.enter("peer"); err != nil {
		return err
	}
	defer d.leave()
	pctx := p.ctx
	err = d.do(func() error {
		err := d.drv.cuCtxEnablePeerAccess.call(pctx, 0)
		var ce *Error
		if errors.As(err, &ce) && ce.Code == errPeerAlreadyEnabled {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("cuda: enable peer %d -> %d: %w", d.info.Ordinal, p.info.Ordinal, err)
	}
	return nil
}

// CopyPeer queues a copy of n elements from src (on device p) into dst (on
// d), ordered on d's stream. Peer access need not be enabled (the driver
// stages through the host then).
func (d *Device) CopyPeer(dst *Buffer, src *Buffer, n int) error {
	if err := d.enter("copy peer"); err != nil {
		return err
	}
	defer d.leave()
	if dst == nil || src == nil || dst.dev != d || src.dev == nil || dst.dead() || src.dead() {
		return fmt.Errorf("cuda: copy peer: dst must be a live buffer of this device and src a live buffer")
	}
	if dst.dt != src.dt || n < 0 || n > dst.n || n > src.n {
		return fmt.Errorf("cuda: copy peer: %d elements from %d %s into %d %s", n, src.n, src.dt, dst.n, dst.dt)
	}
	if n == 0 {
		return nil
	}
	dp, sp, dctx, sctx, bytes := dst.ptr, src.ptr, d.ctx, src.dev.ctx, n*dst.dt.Size()
	d.post(func() error {
		return d.drv.cuMemcpyPeerAsync.call(uintptr(dp), dctx, uintptr(sp), sctx, uintptr(bytes), d.stream)
	})
	return nil
}
