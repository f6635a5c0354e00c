//go:build unix

package bench

import "syscall"

// cpuTime returns the CPU time the process has used so far, in
// nanoseconds, or 0 if the system does not say.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
