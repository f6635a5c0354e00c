package nat

import (
	"math"
	"sync"
	"testing"

	"github.com/hash4/hash4"
)

// TestPortsTakeAny takes every port of ranges that start and end inside
// words of the bitmap, from starts on either side of word boundaries, with
// and without parity, reserved ports and full words (pre: ports taken
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
		{1000, 2100, 535, anyParity, alloc, 0, 0}, // port 1535, the last of a word
		{1000, 2100, 1100, oddParity, alloc, 0, 0},
		{1000, 2100, 7, evenParity, alloc, 0, 0},
		{65000, 65535, 300, anyParity, alloc, 0, 0},
		{1024, 1024, 5, anyParity, alloc, 0, 0},
		{1000, 2100, math.MaxUint32 - 2, anyParity, alloc, 0, 0}, // as randUint32 may give
		// Words fill up, one after the other: the next port after each.
		{2048, 3100, 0, anyParity, nil, 0, 0},
		// A full word past hi: from 2568, the next port is 2048.
		{2048, 2600, 520, anyParity, nil, 2560, 2623},
	} {
		var a addrPorts
		for p := c.pre; p != 0 && p <= c.to; p++ {
			a.take(p)
		}
		size := uint32(c.hi-c.lo) + 1
		var want []uint16
		for i := range size {
			p := c.lo + uint16((c.start%size+i)%size)
			if (c.parity == anyParity || int(p&1) == c.parity) && !c.alloc.Reserved(p) && !a.taken(p) {
				want = append(want, p)
			}
		}
		for i, w := range want {
			p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, c.alloc)
			if !ok || p != w {
				t.Fatalf("%+v: take %d = %d, %v; want %d", c, i, p, ok, w)
			}
			if !a.taken(p) {
				t.Fatalf("%+v: port %d given, not taken", c, p)
			}
		}
		if p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, c.alloc); ok {
			t.Fatalf("%+v: took port %d of a full range", c, p)
		}
		last := want[len(want)-1]
		if a.take(last) {
			t.Fatalf("%+v: port %d taken twice", c, last)
		}
		a.release(last)
		if a.taken(last) {
			t.Fatalf("%+v: port %d still taken after its release", c, last)
		}
		if p, ok := a.takeAny(c.lo, c.hi, c.start, c.parity, math.MaxUint32, c.alloc); !ok || p != last {
			t.Fatalf("%+v: after releasing %d took %d, %v", c, last, p, ok)
		}
	}
}

// TestPortsTries checks that takeAny looks at no more than tries ports.
func TestPortsTries(t *testing.T) {
	var a addrPorts
	if a.taken(2000) {
		t.Fatal("the zero addrPorts has a port taken")
	}
	for p := uint16(2000); p < 2010; p++ {
		if !a.take(p) {
			t.Fatalf("port %d not taken", p)
		}
	}
	if a.take(2005) {
		t.Fatal("a taken port was taken again")
	}
	if p, ok := a.takeAny(2000, 3000, 0, evenParity, 10, nil); ok {
		t.Fatalf("took port %d past 10 taken ports with 10 tries", p)
	}
	if p, ok := a.takeAny(2000, 3000, 0, evenParity, 11, nil); !ok || p != 2010 {
		t.Fatalf("took %d, %v with 11 tries; want 2010", p, ok)
	}
}

// TestPortsConcurrent has goroutines take every port of a range at once
// and release half: no port is given twice or lost.
func TestPortsConcurrent(t *testing.T) {
	const lo, hi, workers = 1024, 9215, 4
	var a addrPorts
	got := make([][]uint16, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p, ok := a.takeAny(lo, hi, randUint32(), anyParity, math.MaxUint32, nil)
				if !ok {
					return
				}
				got[w] = append(got[w], p)
				if len(got[w])%2 == 0 {
					a.release(got[w][len(got[w])-2])
				}
			}
		}()
	}
	wg.Wait()
	// Each worker holds the odd ports of its list, and its last.
	holder := map[uint16]int{}
	for w := range workers {
		for i, p := range got[w] {
			if i%2 == 0 && i != len(got[w])-1 {
				continue
			}
			if o, ok := holder[p]; ok {
				t.Fatalf("port %d held by workers %d and %d", p, o, w)
			}
			holder[p] = w
		}
	}
	for p := uint16(lo); p <= hi; p++ {
		if _, ok := holder[p]; !ok || !a.taken(p) {
			t.Fatalf("port %d: held by a worker %v, taken %v, after every taker found the range full", p, ok, a.taken(p))
		}
	}
}
