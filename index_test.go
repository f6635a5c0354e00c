package hash4

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The occupancy index (index.go) must not change Connect's answer: these
// tests run the same operations on two tables with the same secret and two
// allocators with the same keys, one connecting with the scan and one with
// the index, and require the same ports and the same perturb slots.

// indexDiff is one differential run.
type indexDiff struct {
	t          testing.TB
	r          *rand.Rand
	scan, idx  *Table[int]
	as, ai     *PortAllocator
	locals     []netip.Addr
	dsts       []netip.AddrPort
	rng        PortRange
	releases   [][2]func()
	ops        []string // for the failure message
	v          *int
	connectOps int
	tookOver   int // connects that took over a flow in TIME_WAIT
}

// newIndexDiff makes a run whose choices come from seed.
func newIndexDiff(t testing.TB, seed uint64) *indexDiff {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	d := &indexDiff{t: t, r: r, v: valPtr(1)}
	// Ranges of every parity and size, small enough to fill.
	low := uint16(1 + r.IntN(65000))
	size := 1 + r.IntN(300)
	if r.IntN(8) == 0 {
		size = 1 + r.IntN(3)
	}
	d.rng = PortRange{low, uint16(min(int(low)+size-1, 65535))}
	opts := []PortOption{WithPortRange(d.rng), WithPortSecret(r.Uint64(), r.Uint64()), WithPerturbSeed(r.Uint64())}
	if r.IntN(2) == 0 {
		opts = append(opts, WithPolicy(Flat))
	}
	if r.IntN(2) == 0 {
		var res []uint16
		for range r.IntN(size/4 + 2) {
			res = append(res, d.port())
		}
		opts = append(opts, WithReservedPorts(res...))
	}
	var err error
	d.as, err = NewPortAllocator(opts...)
	require.NoError(t, err)
	d.ai, err = NewPortAllocator(opts...)
	require.NoError(t, err)
	sec := Secret{Ehash: r.Uint32(), Ehash6Addr: r.Uint32(), Seed: r.Uint64()}
	var topts []Option
	if r.IntN(2) == 0 {
		topts = append(topts, WithHasher(Hasher(r.IntN(int(FoldHasher)+1))))
	}
	topts = append(topts, WithCapacity(16<<r.IntN(4)), WithSecret(sec))
	d.scan, d.idx = New[int](topts...), New[int](topts...)
	d.locals = []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}
	d.dsts = []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:443"), netip.MustParseAddrPort("192.0.2.1:80")}
	if r.IntN(4) == 0 {
		d.locals = []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}
		d.dsts = []netip.AddrPort{netip.MustParseAddrPort("[2001:db8::80]:443"), netip.MustParseAddrPort("[2001:db8::80]:80")}
	}
	return d
}

// port returns a port of the range, or now and then one near it.
func (d *indexDiff) port() uint16 {
	if d.r.IntN(16) == 0 {
		return uint16(max(1, int(d.rng.Low)-2+d.r.IntN(d.rng.Size()+4)))
	}
	return uint16(int(d.rng.Low) + d.r.IntN(d.rng.Size()))
}

func (d *indexDiff) flow() (netip.Addr, netip.AddrPort) {
	return d.locals[d.r.IntN(len(d.locals))], d.dsts[d.r.IntN(len(d.dsts))]
}

func (d *indexDiff) logf(format string, args ...any) {
	d.ops = append(d.ops, fmt.Sprintf(format, args...))
}

// step runs one random operation on both sides and compares them.
func (d *indexDiff) step() {
	t, r := d.t, d.r
	local, dst := d.flow()
	tup := Tuple{Local: netip.AddrPortFrom(local, d.port()), Remote: dst}
	switch op := r.IntN(20); {
	case op < 3:
		d.logf("insert %v", tup)
		e1, e2 := d.scan.Insert(tup, d.v), d.idx.Insert(tup, d.v)
		require.Equal(t, e1 == nil, e2 == nil, d.ops)
	case op < 5:
		d.logf("delete %v", tup)
		_, ok1 := d.scan.Delete(tup)
		_, ok2 := d.idx.Delete(tup)
		require.Equal(t, ok1, ok2, d.ops)
	case op == 5:
		d.logf("store/compute %v", tup)
		require.NoError(t, d.scan.Store(tup, d.v))
		require.NoError(t, d.idx.Store(tup, d.v))
		del := func(*int, bool) (*int, ComputeOp) { return nil, DeleteOp }
		if r.IntN(2) == 0 {
			_, _, err := d.scan.Compute(tup, del)
			require.NoError(t, err)
			_, _, err = d.idx.Compute(tup, del)
			require.NoError(t, err)
		}
	case op == 6:
		bind := netip.AddrPortFrom(local, d.port())
		if r.IntN(3) == 0 {
			bind = netip.AddrPortFrom(netip.IPv4Unspecified(), bind.Port())
			if local.Is6() {
				bind = netip.AddrPortFrom(netip.IPv6Unspecified(), bind.Port())
			}
		}
		d.logf("bind %v", bind)
		r1, e1 := d.as.Bind(bind)
		r2, e2 := d.ai.Bind(bind)
		require.Equal(t, e1 == nil, e2 == nil, d.ops)
		if e1 == nil {
			d.releases = append(d.releases, [2]func(){r1, r2})
		}
	case op == 7 && len(d.releases) > 0:
		i := r.IntN(len(d.releases))
		d.logf("release %d", i)
		d.releases[i][0]()
		d.releases[i][1]()
		d.releases = append(d.releases[:i], d.releases[i+1:]...)
	case op == 8 && r.IntN(4) == 0: // a build locks every stripe: not often
		d.logf("build index %v %v", local, dst)
		var k key
		d.idx.setKey(&k, local, 0, dst)
		d.idx.buildIndex(destOf(&k))
	case op == 9:
		switch r.IntN(3) {
		case 0:
			d.logf("grow")
			_ = d.scan.Grow(2 * d.scan.Stats().Buckets)
			_ = d.idx.Grow(2 * d.idx.Stats().Buckets)
		case 1:
			d.logf("compact")
			d.scan.Compact()
			d.idx.Compact()
		case 2:
			d.logf("delete func")
			odd := func(tup Tuple, _ *int) bool { return tup.Local.Port()%7 == 0 }
			require.Equal(t, d.scan.DeleteFunc(odd), d.idx.DeleteFunc(odd), d.ops)
		}
	case op == 10 || op == 11:
		// TIME_WAIT marks, since one of a few times, or cleared.
		since := time.Time{}
		if r.IntN(4) != 0 {
			since = diffEpoch.Add(time.Duration(r.IntN(4)) * time.Second)
		}
		d.logf("timewait %v %v", tup, since)
		require.Equal(t, d.scan.TimeWait(tup, since), d.idx.TimeWait(tup, since), d.ops)
	default:
		d.connect(local, dst)
	}
}

// diffEpoch is the time the differential runs' TIME_WAIT marks start at.
var diffEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// connect connects both sides and compares.
func (d *indexDiff) connect(local netip.Addr, dst netip.AddrPort) {
	t, r := d.t, d.r
	d.connectOps++
	var opts [2][]ConnectOption // scan's, index's
	var cr PortRange
	if r.IntN(6) == 0 {
		cr = PortRange{d.port(), d.port()}
		opts[0] = append(opts[0], WithConnectRange(cr))
		opts[1] = append(opts[1], WithConnectRange(cr))
	}
	var old [2]*int
	reuse := r.IntN(3) == 0
	if reuse {
		// A policy that allows marks older than a cut, but not on some
		// ports.
		cut, salt := diffEpoch.Add(time.Duration(r.IntN(4))*time.Second), uint16(r.Uint32())
		allow := func(tup Tuple, since time.Time) bool {
			return since.Before(cut) && (tup.Local.Port()^salt)%4 != 0
		}
		opts[0] = append(opts[0], WithTimeWaitReuse(allow, &old[0]))
		opts[1] = append(opts[1], WithTimeWaitReuse(allow, &old[1]))
	}
	v := valPtr(d.connectOps)
	if r.IntN(4) == 0 {
		// ConnectFunc, refusing ports by a rule both sides share.
		salt := uint16(r.Uint32())
		f := func(tup Tuple) (*int, error) {
			if (tup.Local.Port()^salt)%5 == 0 {
				return nil, ErrPortRefused
			}
			return v, nil
		}
		d.logf("connectfunc %v %v range %v reuse %v", local, dst, cr, reuse)
		t1, _, e1 := d.scan.connectFlow(d.as, local, dst, nil, f, connectHashOnce, opts[0])
		t2, _, e2 := d.idx.connectFlow(d.ai, local, dst, nil, f, connectIndexed, opts[1])
		require.Equal(t, t1, t2, d.ops)
		require.Equal(t, e1 == nil, e2 == nil, d.ops)
	} else {
		d.logf("connect %v %v range %v reuse %v", local, dst, cr, reuse)
		t1, e1 := d.scan.connect(d.as, local, dst, v, connectHashOnce, opts[0])
		t2, e2 := d.idx.connect(d.ai, local, dst, v, connectIndexed, opts[1])
		require.Equal(t, t1, t2, d.ops)
		require.Equal(t, e1 == nil, e2 == nil, d.ops)
	}
	require.Equal(t, old[0], old[1], "values taken over %v", d.ops)
	if old[0] != nil {
		d.tookOver++
	}
	if d.as.perturb != d.ai.perturb {
		t.Fatalf("perturb slots differ after %q", d.ops)
	}
}

// checkIndexes requires every index of tb to hold exactly the ports its
// destination uses, live or reserved: the state writers leave once they
// quiesce.
func checkIndexes(t testing.TB, tb *Table[int]) {
	t.Helper()
	c := tb.clients()
	if c == nil || c.indexes.set.Load() == nil {
		return
	}
	x := c.indexes.set.Load()
	for _, ps := range x.byHash {
		for _, p := range ps {
			var k key
			k.local, k.remote = p.dest.local, p.dest.remote
			n := 0
			for port := uint32(1); port < 65536; port++ {
				k.setPort(p.dest.hash0, uint16(port), p.dest.rport)
				_, b := tb.lockBucket(k.hash())
				e, _, _ := tb.findLocked(b, &k)
				marked := c.marks.reusable(&k)
				b.unlock()
				present := e != nil
				if present {
					n++
				}
				if present == p.freeBit(port, false) {
					t.Fatalf("port %d: present %v, bit %v", port, present, !p.freeBit(port, false))
				}
				if reuse := p.reuse[port/64].Load()&(1<<(port%64)) != 0; reuse != marked {
					t.Fatalf("port %d: in TIME_WAIT %v, reuse bit %v", port, marked, reuse)
				}
			}
			require.Equal(t, int64(n), p.n.Load())
		}
	}
}

// runIndexDiff runs n steps of seed's run, mostly connects so that the range
// fills, and checks the indexes at the end; it returns the number of
// TIME_WAIT takeovers.
func runIndexDiff(t testing.TB, seed uint64, n int) int {
	d := newIndexDiff(t, seed)
	for range n {
		d.step()
	}
	// Fill to exhaustion toward one destination, then churn at the top.
	local, dst := d.locals[0], d.dsts[0]
	for range d.rng.Size() + 2 {
		d.connect(local, dst)
	}
	for range 50 {
		d.step()
		d.connect(local, dst)
	}
	checkIndexes(t, d.idx)
	return d.tookOver
}

// TestConnectIndexedMatchesScan is the differential test over random
// tables, allocators and occupancies.
func TestConnectIndexedMatchesScan(t *testing.T) {
	seeds := 60
	if testing.Short() || raceEnabled {
		seeds = 15
	}
	tookOver := 0
	for seed := range uint64(seeds) {
		tookOver += runIndexDiff(t, seed, 400)
	}
	t.Logf("%d TIME_WAIT takeovers", tookOver)
	require.Positive(t, tookOver, "no run took a flow in TIME_WAIT over")
}

// TestConnectIndexedBuilt checks that a long scan builds the index, that
// Connect then uses it, and that the index is dropped when its
// destination empties.
func TestConnectIndexedBuilt(t *testing.T) {
	a := newTestAllocator(t, WithPortRange(PortRange{40000, 40999}))
	tb := connTable(1 << 12)
	dst := connDsts[0]
	// Flows put in by Insert, at random: the scans meet them.
	r := rand.New(rand.NewPCG(1, 2))
	for _, i := range r.Perm(1000)[:900] {
		require.NoError(t, tb.Insert(Tuple{netip.AddrPortFrom(connLocal, uint16(40000+i)), dst}, valPtr(1)))
	}
	for range 50 {
		_, err := tb.Connect(a, connLocal, dst, valPtr(1))
		require.NoError(t, err)
	}
	require.NotNil(t, tb.clients().indexes.set.Load(), "no index after 50 connects at 90%")
	checkIndexes(t, tb)
	tb.Clear()
	_, err := tb.Connect(a, connLocal, dst, valPtr(1))
	require.NoError(t, err)
	require.Nil(t, tb.clients().indexes.set.Load(), "index of an emptied destination kept")
}

// TestConnectIndexedConcurrent runs indexed Connects, Deletes, Inserts and
// index builds concurrently, and then checks that the index is exact and
// that no tuple was given twice.
func TestConnectIndexedConcurrent(t *testing.T) {
	a := newTestAllocator(t, WithPortRange(PortRange{40000, 40999}))
	tb := connTable(1 << 10)
	dst := connDsts[0]
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []Tuple
			for range 3000 {
				switch r.IntN(4) {
				case 0, 1:
					tup, err := tb.Connect(a, connLocal, dst, valPtr(g))
					if errors.Is(err, ErrNoPorts) {
						continue
					}
					require.NoError(t, err)
					mine = append(mine, tup)
				case 2:
					if len(mine) > 0 {
						i := r.IntN(len(mine))
						v, ok := tb.Delete(mine[i])
						require.True(t, ok)
						require.Equal(t, g, *v)
						mine = append(mine[:i], mine[i+1:]...)
					}
				case 3:
					if r.IntN(50) == 0 {
						var k key
						tb.setKey(&k, connLocal, 0, dst)
						tb.buildIndex(destOf(&k))
					}
				}
			}
		}()
	}
	wg.Wait()
	checkIndexes(t, tb)
}
