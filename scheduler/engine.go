package scheduler

import (
	"context"

	"github.com/troupe/troupe/gpu"

	"github.com/troupe/troupe/models"
)

// ModelEngine runs a whole model in this goroutine: the engine of a
// single-stage replica, and the baseline the actor path is measured against.
type ModelEngine struct {
	Model *models.Model
	Cache *models.Cache
}

// Forward implements Engine.
func (e *ModelEngine) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	return e.Model.Forward(ctx, e.Cache, b, logits)
}

// ForwardArgmax implements ArgmaxEngine: on a device with a device-side
// argmax only the chosen ids come back, not the logits.
func (e *ModelEngine) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	return e.Model.ForwardArgmax(ctx, e.Cache, b, ids)
}

// ForwardChoose implements ChooseEngine.
func (e *ModelEngine) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	return e.Model.ForwardChoose(ctx, e.Cache, b, rows, ids, logits)
}

// ForwardSample implements SampleEngine: on a device that draws tokens
// itself only the drawn ids come back.
func (e *ModelEngine) ForwardSample(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) error {
	return e.Model.ForwardSample(ctx, e.Cache, b, rows, ids)
}
