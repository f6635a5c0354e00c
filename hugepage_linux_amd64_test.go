package hash4

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// The test below reads what the kernel recorded of the advice, so it runs
// where the kernel runs the test natively: CI runs the other targets under
// qemu-user, which takes madvise's advice and drops it.

// TestHugePagesAdvised checks that a table made WithHugePages advises the
// arrays it writes whole for huge pages, where the kernel has them, and
// that no array of a table made without the option is: the kernel's flag
// for the advice ("hg" in the VmFlags of /proc/self/smaps) is on the huge
// pages within the bucket lines of New and of Grow, or on none. N.B. it runs in a process of its own, the table without the option
// first: the advice stays with memory the heap reuses, and an array freed
// by an earlier test may hold an array of this one. A UDPTable's hash4
// chain heads are checked the same way.
func TestHugePagesAdvised(t *testing.T) {
	if os.Getenv(hugePagesChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHugePagesAdvised$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), hugePagesChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestHugePagesAdvised") {
			t.Fatalf("in a process of its own: %v\n%s", err, out)
		}
		t.Logf("in a process of its own:\n%s", out)
		return
	}
	hp := hugePageSize()
	advised := hp != 0
	if !advised {
		t.Log("no transparent huge pages: checking that nothing is advised")
		hp = 2 << 20
	}
	checkUDPHugePages(t, hp, false, nil)
	checkHugePages(t, hp, false, nil)
	checkHugePages(t, hp, advised, []Option{WithHugePages()})
	checkUDPHugePages(t, hp, advised, []Option{WithHugePages()})
}

// checkUDPHugePages makes a UDPTable with opts and checks the advice on its
// hash4 chain heads.
func checkUDPHugePages(t *testing.T, hp uintptr, advised bool, opts []Option) {
	u := NewUDPTable[int](append([]Option{WithCapacity(1 << 20)}, opts...)...)
	h := u.h4.heads
	checkAdvice(t, hp, fmt.Sprintf("UDPTable, options %d, hash4 chain heads", len(opts)),
		unsafe.Pointer(&h[0]), uintptr(len(h))*unsafe.Sizeof(h[0]), advised)
	runtime.KeepAlive(u)
}

// checkHugePages makes a table with opts, grows it and checks the advice
// on its bucket lines, New's and Grow's, as advised says.
func checkHugePages(t *testing.T, hp uintptr, advised bool, opts []Option) {
	tab := New[int](append([]Option{WithCapacity(1 << 17)}, opts...)...)
	made := tab.arr.Load().lines
	if err := tab.Grow(1 << 20); err != nil {
		t.Fatal(err)
	}
	grown := tab.arr.Load().lines
	for _, c := range []struct {
		name  string
		lines []bucket[int]
	}{{"bucket lines of New", made}, {"bucket lines of Grow", grown}} {
		checkAdvice(t, hp, fmt.Sprintf("options %d, %s", len(opts), c.name), unsafe.Pointer(&c.lines[0]), uintptr(len(c.lines))*unsafe.Sizeof(c.lines[0]), advised)
	}
	runtime.KeepAlive(made)
	runtime.KeepAlive(tab)
}

// checkAdvice checks that the kernel's flag for the advice is on every
// mapping of the whole huge pages within the size bytes at base, or on
// none, as advised says.
func checkAdvice(t *testing.T, hp uintptr, name string, base unsafe.Pointer, size uintptr, advised bool) {
	t.Helper()
	off, n := hugePageSpan(uintptr(base), size, hp)
	if n == 0 {
		t.Fatalf("%s: no whole huge page in %d bytes", name, size)
	}
	areas, err := vmAreas(uintptr(base)+off, uintptr(base)+off+n)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, ar := range areas {
		if got := slices.Contains(strings.Fields(ar.flags), "hg"); got != advised {
			t.Errorf("%s: mapping %#x-%#x has VmFlags %q: advised %v, want %v", name, ar.start, ar.end, ar.flags, got, advised)
		}
	}
}

// hugePagesChildEnv, set in the environment, runs TestHugePagesAdvised's
// checks in the process rather than in a child.
const hugePagesChildEnv = "HASH4_HUGEPAGES_CHILD"

// vmArea is a mapping of /proc/self/smaps.
type vmArea struct {
	start, end uintptr
	flags      string // VmFlags
}

// vmAreas returns the mappings of /proc/self/smaps that overlap [beg,
// end), or an error unless they cover it, each with its VmFlags.
func vmAreas(beg, end uintptr) ([]vmArea, error) {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, err
	}
	var areas []vmArea
	in := false // whether the lines read belong to a mapping kept
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's first line
			var lo, hi uintptr
			if _, err := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); err != nil {
				return nil, fmt.Errorf("smaps line %q: %v", line, err)
			}
			in = lo < end && hi > beg
			if in {
				areas = append(areas, vmArea{start: lo, end: hi})
			}
		} else if fields[0] == "VmFlags:" && in {
			areas[len(areas)-1].flags = strings.Join(fields[1:], " ")
		}
	}
	next := beg
	for _, a := range areas {
		if a.start > next || a.flags == "" {
			return nil, fmt.Errorf("[%#x, %#x) is not covered by mappings with VmFlags in /proc/self/smaps: %+v", beg, end, areas)
		}
		next = a.end
	}
	if next < end {
		return nil, fmt.Errorf("[%#x, %#x) is not covered by mappings in /proc/self/smaps: %+v", beg, end, areas)
	}
	return areas, nil
}
