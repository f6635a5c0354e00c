package hash4

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// TestEntryKeyStoreLoad checks that a key stored into an entry's words
// loads back whole, in every word.
func TestEntryKeyStoreLoad(t *testing.T) {
	var x entryKey
	for _, k := range []key{
		{meta: 1<<63 | 7, remote: [2]uint64{1, 2}, local: [2]uint64{3, 4}},
		{meta: 0xdead_beef_0050_01bb, remote: [2]uint64{^uint64(0), 5}, local: [2]uint64{6, ^uint64(0)}},
		{},
	} {
		x.store(&k)
		if got := x.load(); got != k {
			t.Errorf("stored %+v, loaded %+v", k, got)
		}
	}
}

// TestRelPointer checks relPointer's round trip, nil included.
func TestRelPointer(t *testing.T) {
	var p relPointer[int]
	if p.Load() != nil {
		t.Fatal("zero relPointer does not load nil")
	}
	v := new(int)
	p.Store(v)
	if p.Load() != v {
		t.Fatal("relPointer loads another pointer than the one stored")
	}
	p.Store(nil)
	if p.Load() != nil {
		t.Fatal("relPointer does not load the nil stored")
	}
}

// BenchmarkStore compares a release store with sync/atomic's store of the
// same word. Outside race builds on amd64, the first is a plain store behind
// a call and the second an XCHG.
func BenchmarkStore(b *testing.B) {
	b.Run("impl=release", func(b *testing.B) {
		var x relUint64
		for i := uint64(0); i < uint64(b.N); i++ {
			x.Store(i)
		}
	})
	b.Run("impl=syncatomic", func(b *testing.B) {
		var x atomic.Uint64
		for i := uint64(0); i < uint64(b.N); i++ {
			x.Store(i)
		}
	})
}

// TestInlining pins the inlining that the lookup loops rely on: a call left
// in them costs as much as the loads it wraps. A change that makes one of
// these too costly for the inliner fails here rather than in a benchmark.
// It checks the builds for amd64 and arm64, wherever it runs. On 32-bit
// targets a 64-bit atomic load is a call, so entryKey.matches, which makes
// five, is over the inliner's budget there whatever its form.
func TestInlining(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which runs these tests, is not on PATH: %v", err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		// A test build, so that the generic code is instantiated (with
		// the tests' types) and its inlining reported too.
		cmd := exec.Command(goTool, "test", "-c", "-gcflags=-m", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOARCH="+arch)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("GOARCH=%s go test -c -gcflags=-m: %v\n%s", arch, err, out)
		}
		for _, fn := range []string{
			"(*entryKey).matches",
			"(*relUint32).Load",
			"(*relUint64).Load",
			"(*linkField).load",
			"setWordsRepr",
			"setWordsReprAt",
			"wordsAreIPv4",
			"(*key).setPort",
			"(*entry[int]).read",
			"(*entry[int]).readListener",
			// The one-line read: a lookup's line from its hash, and the
			// liveness test writers make of it.
			"(*bucketArray[int]).line",
			"(*entry[int]).live",
			"(*bucket[int]).lock",
			"specified",
		} {
			if !strings.Contains(string(out)+"\n", "can inline "+fn+"\n") {
				t.Errorf("%s: %s no longer inlines", arch, fn)
			}
		}
	}
}

// TestAtomicStoresTag checks that the hash4_atomicstores build tag builds
// every release store as a sync/atomic store on amd64, where the default
// build makes them plain stores.
func TestAtomicStoresTag(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which runs these tests, is not on PATH: %v", err)
	}
	for _, c := range []struct {
		tags string
		want string
	}{
		{"", "release_amd64.go"},
		{"hash4_atomicstores", "release_atomic.go"},
	} {
		cmd := exec.Command(goTool, "list", "-tags="+c.tags, "-f", "{{.GoFiles}}", ".")
		cmd.Env = append(os.Environ(), "GOARCH=amd64", "GOFLAGS=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags=%q: %v\n%s", c.tags, err, out)
		}
		files := strings.Fields(strings.Trim(strings.TrimSpace(string(out)), "[]"))
		if !slices.Contains(files, c.want) || slices.Contains(files, "release_amd64.go") == slices.Contains(files, "release_atomic.go") {
			t.Errorf("tags %q: files %v, want %s and not the other release file", c.tags, files, c.want)
		}
	}
}
