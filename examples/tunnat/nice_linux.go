package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The gateway's scheduling priority (-nice). On processors it shares with
// the endpoints, as in -demo and -compare, a user-space NAT is one more
// task the scheduler shares them with: a receiver that cannot keep up gets
// a fair share, not a processor, and drops what it cannot take. The
// kernel's NAT is not such a task: it runs in the sender's system call and
// is charged to the sender. A niceness above 0 lets the endpoints go first,
// as they would past the kernel's NAT; on a processor of its own the
// gateway loses nothing by it, but below other busy programs it waits.

// processNice is the niceness setNice last gave the process.
var processNice int

// setNice gives every thread of the process niceness n (0 to 19). Linux
// keeps a niceness per thread and a new thread takes its maker's, so the
// threads Go starts later run at n too; a second pass catches a thread
// made during the first.
func setNice(n int) error {
	if n == processNice {
		return nil
	}
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("-nice %d: %w", n, err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			// A thread that has ended meanwhile is ESRCH: nothing to do.
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
				return fmt.Errorf("-nice %d: %w", n, err)
			}
		}
	}
	processNice = n
	return nil
}

// endpointArgs returns the command line that runs args in namespace ns at
// niceness 0, whatever the gateway's: the clients and servers that -demo
// and -compare start.
func endpointArgs(ns string, args ...string) []string {
	cmd := append([]string{"ip", "netns", "exec", ns}, args...)
	if processNice != 0 {
		cmd = append([]string{"nice", "-n", strconv.Itoa(-processNice)}, cmd...)
	}
	return cmd
}
