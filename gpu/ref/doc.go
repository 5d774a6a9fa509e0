// Package ref is the float64 reference lane: a gpu.Device whose operations
// are written for clarity and computed in float64, storing F32 results.
// Tests check every other lane's operations against it; it is far too slow
// to serve with.
package ref
