package porttest

import "testing"

func TestPorts(t *testing.T) {
	a, b := Ports(4), Ports(1)
	if a.Size() != 4 || b.Size() != 1 || b.Low != a.High+1 {
		t.Errorf("blocks %v and %v: want 4 ports, then the next 1", a, b)
	}
	if a.Low < 21000 || b.High > 29999 {
		t.Errorf("blocks %v and %v outside 21000-29999", a, b)
	}
}
