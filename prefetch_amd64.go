package hash4

import "unsafe"

// This file and prefetch_amd64.s hold the package's only assembly: Go has
// no intrinsic for a prefetch, with intent to write or not, nor for asking
// the processor whether it has the first.

// canPrefetch reports whether the package issues prefetches for reading:
// PREFETCHT0 is part of SSE, which every amd64 processor has. A variable,
// so that tests can take the path of other architectures
// (Table.AppendLookups).
var canPrefetch = true

// canPrefetchW reports whether the processor has PREFETCHW: CPUID leaf
// 0x80000001, ECX bit 8 (PRFCHW; Linux's X86_FEATURE_3DNOWPREFETCH), set
// on AMD's processors and on Intel's since Broadwell. As in Linux, the
// instruction is used only where the bit is set. A variable, so that tests
// can take the other path.
var canPrefetchW = hasPrefetchW()

// hasPrefetchW asks CPUID whether the processor has PREFETCHW.
func hasPrefetchW() bool {
	if maxExt, _, _, _ := cpuid(0x80000000, 0); maxExt < 0x80000001 {
		return false
	}
	_, _, ecx, _ := cpuid(0x80000001, 0)
	return ecx&(1<<8) != 0
}

// touchForWrite brings the lines of a chain head and of both halves of an
// entry (its seq and its val, 48 bytes apart, on two lines when the
// 56-byte entry straddles a boundary) toward the cache before the caller
// writes them under a lock (see Table.touch). With PREFETCHW the lines
// come in the state a store needs, and the call does not wait for them;
// without it, it loads the two words that readers load atomically.
func touchForWrite(head *linkField, seq *relUint32, val *unsafe.Pointer) {
	if canPrefetchW {
		prefetchw3(head, seq, val)
		return
	}
	head.load()
	seq.Load()
}

// prefetchw3 asks for the cache lines of head, seq and val with PREFETCHW,
// and returns without waiting for them. It is a hint: it neither reads nor
// writes memory as far as the program is concerned. Only for processors
// with canPrefetchW.
//
//go:noescape
func prefetchw3(head *linkField, seq *relUint32, val *unsafe.Pointer)

// prefetch4 asks for the cache lines of a, b, c and d with PREFETCHT0
// (requestGroupLines).
//
//go:noescape
func prefetch4(a, b, c, d unsafe.Pointer)

// prefetchW asks for the cache lines of h's addresses with PREFETCHW (see
// lineHints) and returns without waiting for them. Only for processors
// with canPrefetchW.
func (h *lineHints) prefetchW() { prefetch(h.addr[:h.n], true) }

// prefetchRead asks for the cache lines of h's addresses with PREFETCHT0,
// into every level of the cache, and returns without waiting for them.
func (h *lineHints) prefetchRead() { prefetch(h.addr[:h.n], false) }

// prefetch issues PREFETCHW, if write is set, or PREFETCHT0 for each
// address in addrs. It is a hint: it neither reads nor writes memory as far
// as the program is concerned.
//
//go:noescape
func prefetch(addrs []unsafe.Pointer, write bool)

// cpuid executes CPUID with EAX = leaf and ECX = sub.
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
