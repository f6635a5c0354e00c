package machine

import (
	"runtime"
	"testing"
)

// TestCounters checks that on Linux both counters read, and that work
// done between two reads shows in both.
func TestCounters(t *testing.T) {
	if runtime.GOOS != "linux" {
		if CPUTime() != -1 || Busy() != -1 {
			t.Fatal("counters read where they are not known")
		}
		return
	}
	cpu0, busy0 := CPUTime(), Busy()
	if cpu0 < 0 || busy0 < 0 {
		t.Fatalf("CPUTime %d, Busy %d", cpu0, busy0)
	}
	// 30 ms of work: more than the 10 ms ticks of /proc/stat.
	for x := uint64(1); CPUTime()-cpu0 < 30e6; x = x*6364136223846793005 + 1 {
		_ = x
	}
	if cpu, busy := CPUTime()-cpu0, Busy()-busy0; cpu < 30e6 || busy < 10e6 {
		t.Errorf("after 30 ms of work: CPU time %d ns, busy %d ns", cpu, busy)
	}
}
