//go:build !race

package xgmi

const raceEnabled = false
