// Command cgops runs one workload on one implementation once, so that a
// cache simulator can count what an op costs: instructions and first-level
// data misses per op, as docs/performance.md gives them.
//
//	cgops IMPL WORK DIST N OPS
//
// IMPL is hash4, xsync or rwmutex; WORK is lookup or turnover (delete a
// live flow, insert one that left long ago); DIST is zipf (Zipf(1.1) ranks
// at random places in the fill), zipflast (the hottest flows inserted
// last), zipffirst (inserted first) or uniform; N flows, half IPv4 and half
// IPv6, in a table sized for them; OPS ops. Run it twice under cachegrind,
// with OPS and 2*OPS, and divide the difference by OPS, which leaves the
// fill out:
//
//	GOGC=off GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind \
//		--cache-sim=yes --D1=49152,12,64 --cachegrind-out-file=/dev/null \
//		cgops hash4 lookup zipf 1048576 200000
package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"sync"

	"github.com/hash4/hash4"
	"github.com/puzpuzpuz/xsync/v4"
)

type flowKey struct {
	local, remote [16]byte
	lport, rport  uint16
}

// val is the value each flow maps to.
type val struct{ _ int }

type impl interface {
	lookup(i int) *val
	insert(i int, v *val)
	delete(i int)
}

var tups []hash4.Tuple
var fks []flowKey

type h4 struct{ t *hash4.Table[val] }

func (m h4) lookup(i int) *val    { v, _ := m.t.Lookup(tups[i]); return v }
func (m h4) insert(i int, v *val) { m.t.Insert(tups[i], v) }
func (m h4) delete(i int)         { m.t.Delete(tups[i]) }

type xs struct{ m *xsync.Map[flowKey, *val] }

func (m xs) lookup(i int) *val    { v, _ := m.m.Load(fks[i]); return v }
func (m xs) insert(i int, v *val) { m.m.Store(fks[i], v) }
func (m xs) delete(i int)         { m.m.LoadAndDelete(fks[i]) }

type rw struct {
	mu sync.RWMutex
	m  map[flowKey]*val
}

func (m *rw) lookup(i int) *val {
	m.mu.RLock()
	v := m.m[fks[i]]
	m.mu.RUnlock()
	return v
}
func (m *rw) insert(i int, v *val) { m.mu.Lock(); m.m[fks[i]] = v; m.mu.Unlock() }
func (m *rw) delete(i int)         { m.mu.Lock(); delete(m.m, fks[i]); m.mu.Unlock() }

//go:noinline
func measure(m impl, work string, ops []int32, live []int32, queue []int32) (found int) {
	var v val
	switch work {
	case "lookup":
		for _, i := range ops {
			if m.lookup(int(live[i])) != nil {
				found++
			}
		}
	case "turnover":
		q := 0
		for _, i := range ops {
			m.delete(int(live[i]))
			m.insert(int(queue[q]), &v)
			live[i], queue[q] = queue[q], live[i]
			q++
		}
	}
	return found
}

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: cgops IMPL WORK DIST N OPS")
		os.Exit(2)
	}
	which, work, dist := os.Args[1], os.Args[2], os.Args[3]
	n, err1 := strconv.Atoi(os.Args[4])
	nops, err2 := strconv.Atoi(os.Args[5])
	if err1 != nil || err2 != nil || n < 2 || nops < 0 || nops > 400000 {
		fmt.Fprintln(os.Stderr, "cgops: N must be at least 2 and OPS at most 400000")
		os.Exit(2)
	}
	r := rand.New(rand.NewPCG(1, 2))
	tups = make([]hash4.Tuple, 2*n)
	fks = make([]flowKey, 2*n)
	for i := range tups {
		var la, ra netip.Addr
		if i%2 == 0 {
			la = netip.AddrFrom4([4]byte{10, 0, 0, 1})
			ra = netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(i >> 8), byte(i)})
		} else {
			la = netip.MustParseAddr("2001:db8::1")
			var b [16]byte
			b[0], b[1] = 0x20, 0x01
			for j := 2; j < 16; j++ {
				b[j] = byte(r.Uint32())
			}
			b[12], b[13], b[14], b[15] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
			ra = netip.AddrFrom16(b)
		}
		tups[i] = hash4.Tuple{Local: netip.AddrPortFrom(la, 443), Remote: netip.AddrPortFrom(ra, uint16(1024+r.IntN(60000)))}
		fks[i] = flowKey{la.As16(), ra.As16(), 443, tups[i].Remote.Port()}
	}
	var m impl
	switch which {
	case "hash4":
		m = h4{hash4.New[val](hash4.WithCapacity(n))}
	case "xsync":
		m = xs{xsync.NewMap[flowKey, *val](xsync.WithPresize(n))}
	case "rwmutex":
		m = &rw{m: make(map[flowKey]*val, n)}
	default:
		fmt.Fprintln(os.Stderr, "cgops: IMPL is hash4, xsync or rwmutex")
		os.Exit(2)
	}
	live := make([]int32, n)
	queue := make([]int32, n)
	var v val
	for k, i := range r.Perm(n) {
		live[k] = int32(i)
		queue[k] = int32(n + k)
		m.insert(i, &v)
	}
	ops := make([]int32, 400000)
	z := rand.NewZipf(r, 1.1, 1, uint64(n-1))
	perm := r.Perm(n)
	for k := range ops {
		switch dist {
		case "zipf":
			ops[k] = int32(perm[z.Uint64()])
		case "zipflast":
			ops[k] = int32(n - 1 - int(z.Uint64()))
		case "zipffirst":
			ops[k] = int32(z.Uint64())
		default:
			ops[k] = int32(r.IntN(n))
		}
	}
	fmt.Println(measure(m, work, ops[:nops], live, queue), "lookups found")
}
