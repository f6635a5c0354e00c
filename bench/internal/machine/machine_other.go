//go:build !linux

package machine

// CPUTime returns -1: the CPU time used is not read here.
func CPUTime() int64 { return -1 }

// Busy returns -1: the machine's busy time is not read here.
func Busy() int64 { return -1 }
