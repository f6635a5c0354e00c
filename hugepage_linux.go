package hash4

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// This file asks Linux to back a table's bucket arrays, which a table
// writes whole as it makes them, with transparent huge pages, as the kernel
// allocates its own socket hash tables (alloc_large_system_hash) with huge
// mappings where it can: one fault per 2 MiB rather than 512. It takes a
// slice's address with unsafe, to name its memory to madvise. It is an
// option: the advice stays with the memory once an array is freed.

// hugePageSize returns the size of a transparent huge page (a PMD mapping),
// or 0 if the kernel has none or GODEBUG in the environment sets
// disablethp, by which the Go runtime keeps its heap from huge pages.
var hugePageSize = sync.OnceValue(func() uintptr {
	if thpDisabled(os.Getenv("GODEBUG")) {
		return 0
	}
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n == 0 || n&(n-1) != 0 {
		return 0
	}
	return uintptr(n)
})

// thpDisabled reports whether the GODEBUG value godebug sets disablethp to
// a number other than 0; the last setting wins, as for the runtime.
func thpDisabled(godebug string) bool {
	off := false
	for _, kv := range strings.Split(godebug, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "disablethp" {
			if n, err := strconv.Atoi(v); err == nil {
				off = n != 0
			}
		}
	}
	return off
}

// adviseHugePages asks the kernel to back with huge pages those that lie
// wholly within the memory of s (madvise MADV_HUGEPAGE), before the caller
// writes s whole. The advice is best effort: where it fails, or the kernel
// has no huge page free, the memory is backed as before.
func adviseHugePages[N any](s []N) {
	hp := hugePageSize()
	if hp == 0 || len(s) == 0 {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(s))
	off, n := hugePageSpan(uintptr(base), uintptr(len(s))*unsafe.Sizeof(s[0]), hp)
	if n == 0 {
		return
	}
	_ = syscall.Madvise(unsafe.Slice((*byte)(unsafe.Add(base, off)), n), syscall.MADV_HUGEPAGE)
}

// hugePageSpan returns the offset from addr and the length of the huge
// pages of size hp (a power of two) that lie wholly within the size bytes
// at addr; the length is 0 if none does.
func hugePageSpan(addr, size, hp uintptr) (off, n uintptr) {
	beg := (addr + hp - 1) &^ (hp - 1)
	end := (addr + size) &^ (hp - 1)
	if beg >= end {
		return 0, 0
	}
	return beg - addr, end - beg
}
