package cpu

import "math"

// expf returns e**x in float32 arithmetic with a relative error of a few
// units in the last place: x = n·ln2 + r with |r| ≤ ln2/2, e**r by a
// degree-6 polynomial, then scaled by 2**n through the exponent bits.
// Results below the smallest normal float32 flush to zero.
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	switch {
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -87.33654:
		return 0
	case x != x:
		return x
	}
	fn := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - fn*ln2hi - fn*ln2lo
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	n := int32(fn)
	if n > 127 {
		// x close to the overflow bound: scale in two steps.
		return y * 2 * math.Float32frombits(uint32(n-1+127)<<23)
	}
	if n < -126 {
		return y * 0.5 * math.Float32frombits(uint32(n+1+127)<<23)
	}
	return y * math.Float32frombits(uint32(n+127)<<23)
}
