//go:build race

package xgmi

// raceEnabled: the race detector slows the large sweeps tenfold.
const raceEnabled = true
