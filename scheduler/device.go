package scheduler

import (
	"context"
	"fmt"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/gpu"
)

// DeviceKind is the actor kind of devices.
const DeviceKind = "device"

// DeviceJob is work for a device actor; it runs on the actor's goroutine,
// alone on the device.
type DeviceJob func()

// DeviceProps describes the actor that owns dev: the layer-shards placed on
// the device hand it their forward passes, which it runs one at a time, in
// the order they arrive, so that several shards and replicas can share one
// device. Its STATS show the queue of waiting passes.
func DeviceProps(id string, dev gpu.Device) actors.Props[DeviceJob] {
	return actors.Props[DeviceJob]{
		Kind:        DeviceKind,
		ID:          id,
		New:         func() actors.Actor[DeviceJob] { return deviceActor{} },
		Mailbox:     64,
		Description: dev.Name(),
	}
}

type deviceActor struct{}

func (deviceActor) Receive(_ context.Context, job DeviceJob) error {
	job()
	return nil
}

// onDevice runs f on the shard's device actor and waits for it; without a
// device actor it runs f here. A panic in f fails the call and then
// restarts the device actor.
func (s *Shard) onDevice(ctx context.Context, f func() error) error {
	if s.Device == nil {
		return f()
	}
	done := make(chan error, 1)
	// An idle device runs the job on this goroutine, without a wake-up.
	err := s.Device.SendInline(ctx, func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("device: %v", r)
				panic(r)
			}
		}()
		done <- f()
	})
	if err != nil {
		return fmt.Errorf("device: %w", err)
	}
	// The job touches this shard's buffers: wait for it even if ctx ends,
	// unless the device actor stopped without running it.
	select {
	case err := <-done:
		return err
	case <-s.Device.Done():
		select {
		case err := <-done:
			return err
		default:
			return fmt.Errorf("device: actor stopped")
		}
	}
}
