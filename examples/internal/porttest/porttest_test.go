package porttest

import (
	"testing"

	"github.com/hash4/hash4"
)

func TestPorts(t *testing.T) {
	a, b := Ports(4), Ports(1)
	if a.Size() != 4 || b.Size() != 1 || (b.Low != a.High+1 && b.Low != region.Low) {
		t.Errorf("blocks %v and %v: want 4 ports, then the next 1", a, b)
	}
	eph := ephemeralRange()
	clear := region.High < eph.Low || region.Low > eph.High
	// Many blocks wrap around the region and, where it is clear of the
	// ephemeral range, never overlap it.
	for range 100 {
		r := Ports(1000)
		if r.Size() != 1000 || r.Low < region.Low || r.High > region.High {
			t.Fatalf("block %v: want 1000 ports within %v", r, region)
		}
		if clear && r.High >= eph.Low && r.Low <= eph.High {
			t.Fatalf("block %v overlaps the ephemeral range %v", r, eph)
		}
	}
}

func TestPickRegion(t *testing.T) {
	for _, tt := range []struct{ eph, want hash4.PortRange }{
		{hash4.DefaultPortRange, hash4.PortRange{Low: 21000, High: 28999}},
		{hash4.PortRange{Low: 21000, High: 29999}, hash4.PortRange{Low: 10000, High: 17999}},
		{hash4.PortRange{Low: 1024, High: 65535}, hash4.PortRange{Low: 21000, High: 28999}}, // nothing is clear
		{hash4.PortRange{Low: 30000, High: 65535}, hash4.PortRange{Low: 21000, High: 28999}},
		{hash4.PortRange{Low: 12000, High: 60999}, hash4.PortRange{Low: 21000, High: 28999}}, // nothing is clear
		{hash4.PortRange{Low: 10000, High: 30000}, hash4.PortRange{Low: 31000, High: 38999}},
	} {
		if got := pickRegion(tt.eph); got != tt.want {
			t.Errorf("pickRegion(%v) = %v, want %v", tt.eph, got, tt.want)
		}
	}
}
