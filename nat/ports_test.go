package nat

import (
	"math"
	"sync"
	"testing"

	"github.com/hash4/hash4"
)

// TestPortsTakeAny takes every port of ranges that start and end inside
// chunks, from starts on either side of chunk boundaries, with and without
// parity, reserved ports and full chunks (pre: ports another mapping took
// first): each port of the range and parity not reserved is given once, in
// order from the start, and nothing else; a full range gives none, and a
// released port is the one given next.
func TestPortsTakeAny(t *testing.T) {
	alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1, High: 65535}),
		hash4.WithReservedPorts(1100, 1535, 1536))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lo, hi  uint16
		start   uint32
		parity  int
		alloc   *hash4.PortAllocator
		pre, to uint16
	}{
		{1000, 2100, 0, anyParity, alloc, 0, 0},
		{1000, 2100, 535, anyParity, alloc, 0, 0}, // port 1535, the last of a chunk
		{1000, 2100, 1100, oddParity, alloc, 0, 0},
		{1000, 2100, 7, evenParity, alloc, 0, 0},
		{65000, 65535, 300, anyParity, alloc, 0, 0},
		{1024, 1024, 5, anyParity, alloc, 0, 0},
		// Chunks 2048-2559 and 2560-3071 fill up: the next port after each.
		{2048, 3100, 0, anyParity, nil, 0, 0},
		// A full chunk past hi: from 2568, the next port is 2048.
		{2048, 2600, 520, anyParity, nil, 2560, 3071},
	} {
		var a addrPorts
		m := &mapping{}
		for p := c.pre; p != 0 && p <= c.to; p++ {
			a.take(p, &mapping{})
		}
		size := uint32(c.hi-c.lo) + 1
		var want []uint16
		for i := range size {
			p := c.lo + uint16((c.start+i)%size)
			if (c.parity == anyParity || int(p&1) == c.parity) && !c.alloc.Reserved(p) && a.owner(p) == nil {
				want = append(want, p)
			}
		}
		for i, w := range want {
			p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, m, c.alloc)
			if !ok || p != w {
				t.Fatalf("%+v: take %d = %d, %v; want %d", c, i, p, ok, w)
			}
			if a.owner(p) != m {
				t.Fatalf("%+v: port %d's owner is not the mapping that took it", c, p)
			}
		}
		if p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, m, c.alloc); ok {
			t.Fatalf("%+v: took port %d of a full range", c, p)
		}
		last := want[len(want)-1]
		a.release(last, &mapping{}) // not its owner: nothing changes
		if a.owner(last) != m {
			t.Fatalf("%+v: a release by another mapping freed port %d", c, last)
		}
		a.release(last, m)
		if a.owner(last) != nil {
			t.Fatalf("%+v: port %d still owned after its release", c, last)
		}
		if p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, m, c.alloc); !ok || p != last {
			t.Fatalf("%+v: after releasing %d took %d, %v", c, last, p, ok)
		}
		for i := range a.chunks {
			if ch := a.chunks[i].Load(); ch != nil {
				n := 0
				for j := range ch.owner {
					if ch.owner[j].Load() != nil {
						n++
					}
				}
				if got := ch.taken.Load(); got != int32(n) {
					t.Fatalf("%+v: chunk %d counts %d owners, has %d", c, i, got, n)
				}
			}
		}
	}
}

// TestPortsTries checks that takeAny looks at no more than tries ports.
func TestPortsTries(t *testing.T) {
	var a addrPorts
	m := &mapping{}
	for p := uint16(2000); p < 2010; p++ {
		if !a.take(p, m) {
			t.Fatalf("port %d not taken", p)
		}
	}
	if a.take(2005, &mapping{}) {
		t.Fatal("a taken port was taken again")
	}
	if p, ok := a.takeAny(2000, 3000, 0, evenParity, 10, m, nil); ok {
		t.Fatalf("took port %d past 10 taken ports with 10 tries", p)
	}
	if p, ok := a.takeAny(2000, 3000, 0, evenParity, 11, m, nil); !ok || p != 2010 {
		t.Fatalf("took %d, %v with 11 tries; want 2010", p, ok)
	}
}

// TestPortsConcurrent has goroutines take every port of a range at once
// and release half: no port is given twice or lost, and every chunk's count
// is its owners'.
func TestPortsConcurrent(t *testing.T) {
	const lo, hi, workers = 1024, 9215, 4
	var a addrPorts
	got := make([][]uint16, workers)
	ms := make([]*mapping, workers)
	var wg sync.WaitGroup
	for w := range workers {
		ms[w] = &mapping{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p, ok := a.takeAny(lo, hi, randUint32(), anyParity, math.MaxUint32, ms[w], nil)
				if !ok {
					return
				}
				got[w] = append(got[w], p)
				if len(got[w])%2 == 0 {
					a.release(got[w][len(got[w])-2], ms[w])
				}
			}
		}()
	}
	wg.Wait()
	owner := map[uint16]int{}
	for w := range workers {
		for i, p := range got[w] {
			held := i%2 == 1 || i == len(got[w])-1
			if o, ok := owner[p]; ok && held && o >= 0 {
				t.Fatalf("port %d held by workers %d and %d", p, o, w)
			}
			if held {
				owner[p] = w
			} else if _, ok := owner[p]; !ok {
				owner[p] = -1
			}
		}
	}
	for p := uint16(lo); p <= hi; p++ {
		o := a.owner(p)
		if o == nil {
			t.Fatalf("port %d free after every taker found the range full", p)
		}
		if w, ok := owner[p]; !ok || w < 0 || ms[w] != o {
			t.Fatalf("port %d's owner is not the worker that holds it", p)
		}
	}
}
