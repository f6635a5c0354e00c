package hash4

import "testing"

func TestHugePageSpan(t *testing.T) {
	const hp = 2 << 20
	for _, c := range []struct {
		addr, size, off, n uintptr
	}{
		{addr: 0, size: hp, off: 0, n: hp},
		{addr: 0, size: hp - 1, off: 0, n: 0},
		{addr: 8192, size: hp, off: 0, n: 0},
		{addr: 8192, size: 2 * hp, off: hp - 8192, n: hp},
		{addr: hp - 1, size: 2*hp + 1, off: 1, n: 2 * hp},
		{addr: 3 * hp, size: 5 * hp, off: 0, n: 5 * hp},
		{addr: 3*hp + 4096, size: 5 * hp, off: hp - 4096, n: 4 * hp},
		{addr: 4096, size: 0, off: 0, n: 0},
	} {
		off, n := hugePageSpan(c.addr, c.size, hp)
		if off != c.off || n != c.n {
			t.Errorf("hugePageSpan(%#x, %#x) = %#x, %#x; want %#x, %#x", c.addr, c.size, off, n, c.off, c.n)
		}
	}
}

func TestTHPDisabled(t *testing.T) {
	for _, c := range []struct {
		godebug string
		want    bool
	}{
		{"", false},
		{"disablethp=1", true},
		{"disablethp=0", false},
		{"gctrace=1,disablethp=1", true},
		{"disablethp=1,gctrace=1", true},
		{"disablethp=1,disablethp=0", false},
		{"disablethp=0,disablethp=1", true},
		{"disablethp=x", false},
		{"xdisablethp=1", false},
		{"disablethp", false},
	} {
		if got := thpDisabled(c.godebug); got != c.want {
			t.Errorf("thpDisabled(%q) = %v, want %v", c.godebug, got, c.want)
		}
	}
}
