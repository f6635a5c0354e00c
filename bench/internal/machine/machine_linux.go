package machine

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// CPUTime returns the CPU time the process has used so far, in
// nanoseconds, or -1 if the system does not say.
func CPUTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// Busy returns the time the machine's processors have spent on any work,
// this process's included, or lost to the hypervisor (steal), summed over
// the processors, in nanoseconds, from /proc/stat; -1 if it cannot be
// read.
func Busy() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return -1
	}
	// user nice system idle iowait irq softirq steal, in USER_HZ ticks:
	// 100 per second on every Linux.
	var ticks int64
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 { // not idle, iowait
			ticks += n
		}
	}
	return ticks * 10_000_000
}
