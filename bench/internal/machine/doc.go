// Package machine reads what a benchmark on a machine shared with other
// work needs to know of it: the CPU time this process used, and the time
// the machine's processors were busy with anything, on Linux.
package machine
