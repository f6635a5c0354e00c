//go:build !linux

package hash4

// adviseHugePages does nothing: huge pages are asked for on Linux only
// (hugepage_linux.go).
func adviseHugePages[N any]([]N) {}
