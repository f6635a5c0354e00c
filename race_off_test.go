//go:build !race

package hash4

// raceEnabled reports whether the tests run under the race detector, which
// makes the longest randomized tests run fewer rounds.
const raceEnabled = false
