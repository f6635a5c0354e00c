package hash4

import (
	"testing"

	"github.com/hash4/hash4/internal/benchkit"
)

// BenchmarkStoreSwap compares the writes that replace a present value,
// Store, Swap and Compute, with the Delete and Insert they stand for, on
// the same keys of a table of 1K entries, one goroutine. Compare with
//
//	go test -run '^$' -bench StoreSwap -count=6 . > store.txt
//	benchstat -col /op store.txt
func BenchmarkStoreSwap(b *testing.B) {
	const n = 1024
	keys := make([]Tuple, n)
	vals := make([]*int, n)
	for i := range keys {
		keys[i] = tblKey(i, i%4 == 0)
		vals[i] = valPtr(i)
	}
	ops := []struct {
		name string
		op   func(tab *Table[int], i int)
	}{
		{"DeleteInsert", func(tab *Table[int], i int) {
			k := keys[i%n]
			tab.Delete(k)
			_ = tab.Insert(k, vals[(i+1)%n])
		}},
		{"Store", func(tab *Table[int], i int) { _ = tab.Store(keys[i%n], vals[(i+1)%n]) }},
		{"Swap", func(tab *Table[int], i int) { _, _, _ = tab.Swap(keys[i%n], vals[(i+1)%n]) }},
		{"Compute", func(tab *Table[int], i int) {
			_, _, _ = tab.Compute(keys[i%n], func(old *int, _ bool) (*int, ComputeOp) { return vals[(i+1)%n], UpdateOp })
		}},
	}
	for _, o := range ops {
		b.Run("op="+o.name, func(b *testing.B) {
			tab := New[int](WithCapacity(n), WithSecret(tblSecret))
			for i, k := range keys {
				if err := tab.Insert(k, vals[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				o.op(tab, i)
			}
		})
	}
}

// BenchmarkConnectFunc compares ConnectFunc with Connect: each op connects
// one flow toward one destination and deletes the oldest of the 1K flows
// kept, so the range stays sparsely used and a scan ends at its first
// candidates. Compare with
//
//	go test -run '^$' -bench ConnectFunc -count=6 . > cf.txt
//	benchstat -col /impl cf.txt
func BenchmarkConnectFunc(b *testing.B) {
	for _, impl := range []string{"Connect", "ConnectFunc"} {
		b.Run("impl="+impl, func(b *testing.B) {
			tab := New[int](WithCapacity(4096), WithSecret(connSecret))
			a, err := NewPortAllocator(WithPortSecret(1, 2), WithPerturbSeed(3))
			if err != nil {
				b.Fatal(err)
			}
			v := valPtr(1)
			f := func(Tuple) (*int, error) { return v, nil }
			var ring [1024]Tuple
			connect := func() Tuple {
				var tup Tuple
				var err error
				if impl == "Connect" {
					tup, err = tab.Connect(a, benchkit.ConnLocal, benchkit.ConnRemote, v)
				} else {
					tup, _, err = tab.ConnectFunc(a, benchkit.ConnLocal, benchkit.ConnRemote, f)
				}
				if err != nil {
					b.Fatal(err)
				}
				return tup
			}
			for i := range ring {
				ring[i] = connect()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := i % len(ring)
				tab.Delete(ring[j])
				ring[j] = connect()
			}
		})
	}
}
