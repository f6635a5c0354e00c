package nat

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// The mapping table against a model: endpoint-independent mapping,
// address-dependent filtering, UDP timeouts of two ticks unanswered and
// three answered, twelve external ports for sixteen inside endpoints. The
// model says what each call must return, when each flow expires, and
// that no two live mappings share an external endpoint.

type modelFlow struct {
	last    int // tick of the last packet
	replied bool
	inbound bool
}

type modelKey struct{ inside, remote netip.AddrPort }

type model struct {
	t     *testing.T
	n     *NAT
	clk   *testClock
	now   int // ticks
	flows map[modelKey]*modelFlow
	ext   map[netip.AddrPort]netip.AddrPort // inside endpoint -> external, for live mappings
}

var modelRemotes = []netip.AddrPort{ap("198.51.100.1", 80), ap("198.51.100.1", 81), ap("198.51.100.2", 80), ap("198.51.100.3", 80)}

const modelPorts = 12

func newModel(t *testing.T) *model {
	n, clk := newTest(t, Config{
		Ports:    hash4.PortRange{Low: 3000, High: 3000 + modelPorts - 1},
		Timeouts: Timeouts{UDPUnreplied: 2 * time.Second, UDP: 3 * time.Second},
	})
	return &model{t: t, n: n, clk: clk, flows: map[modelKey]*modelFlow{}, ext: map[netip.AddrPort]netip.AddrPort{}}
}

func modelInside(h, p int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(2 + h%4)}), uint16(5000+p%4))
}

func (m *model) mappingAlive(inside netip.AddrPort) bool {
	for k := range m.flows {
		if k.inside == inside {
			return true
		}
	}
	return false
}

func (m *model) out(inside, remote netip.AddrPort) {
	t := m.t
	got, why := m.n.MapOutbound(UDP, inside, remote)
	k := modelKey{inside, remote}
	if f, ok := m.flows[k]; ok {
		if why != DropNone || got != m.ext[inside] {
			t.Fatalf("out %v->%v on a flow: %v %v, want %v", inside, remote, got, why, m.ext[inside])
		}
		f.last = m.now
		if f.inbound {
			f.replied = true
		}
		return
	}
	if e, ok := m.ext[inside]; ok {
		if why != DropNone || got != e {
			t.Fatalf("out %v->%v, a new flow of mapping %v: %v %v", inside, remote, e, got, why)
		}
	} else {
		if len(m.ext) == modelPorts {
			if why != DropNoPort {
				t.Fatalf("out %v->%v with every port mapped: %v %v", inside, remote, got, why)
			}
			return
		}
		if why != DropNone {
			t.Fatalf("out %v->%v, a new mapping: %v", inside, remote, why)
		}
		if got.Addr() != ext1 || got.Port() < 3000 || got.Port() >= 3000+modelPorts {
			t.Fatalf("new mapping %v", got)
		}
		for in, e := range m.ext {
			if e == got {
				t.Fatalf("new mapping of %v on %v, which %v holds", inside, got, in)
			}
		}
		m.ext[inside] = got
	}
	m.flows[k] = &modelFlow{last: m.now}
}

func (m *model) in(remote, ext netip.AddrPort) {
	t := m.t
	got, why := m.n.MapInbound(UDP, remote, ext)
	var inside netip.AddrPort
	for in, e := range m.ext {
		if e == ext {
			inside = in
		}
	}
	if !inside.IsValid() {
		if why != DropNoFlow {
			t.Fatalf("in %v->%v, no mapping: %v %v", remote, ext, got, why)
		}
		return
	}
	if f, ok := m.flows[modelKey{inside, remote}]; ok {
		if why != DropNone || got != inside {
			t.Fatalf("in %v->%v on a flow: %v %v, want %v", remote, ext, got, why, inside)
		}
		f.last = m.now
		if !f.inbound {
			f.replied = true
		}
		return
	}
	permitted := false
	for k := range m.flows {
		if k.inside == inside && k.remote.Addr() == remote.Addr() {
			permitted = true
		}
	}
	if !permitted {
		if why != DropFiltered {
			t.Fatalf("in %v->%v, not contacted: %v %v", remote, ext, got, why)
		}
		return
	}
	if why != DropNone || got != inside {
		t.Fatalf("in %v->%v, its address contacted: %v %v, want %v", remote, ext, got, why, inside)
	}
	m.flows[modelKey{inside, remote}] = &modelFlow{last: m.now, inbound: true}
}

func (m *model) advance(ticks int) {
	m.now += ticks
	ended := m.clk.advance(time.Duration(ticks) * time.Second)
	want := 0
	for k, f := range m.flows {
		to := 2
		if f.replied {
			to = 3
		}
		if m.now >= f.last+to+1 { // a tick past the timeout (NAT.deadline)
			delete(m.flows, k)
			want++
		}
	}
	for in := range m.ext {
		if !m.mappingAlive(in) {
			delete(m.ext, in)
		}
	}
	if ended != want {
		m.t.Fatalf("at tick %d: %d flows expired, want %d", m.now, ended, want)
	}
	if f, mp := m.n.Len(); f != len(m.flows) || mp != len(m.ext) {
		m.t.Fatalf("at tick %d: %d flows and %d mappings, want %d and %d", m.now, f, mp, len(m.flows), len(m.ext))
	}
}

// run applies the operations ops encodes, three bytes each.
func (m *model) run(ops []byte) {
	for len(ops) >= 3 {
		op, a, b := ops[0], int(ops[1]), int(ops[2])
		ops = ops[3:]
		switch op % 4 {
		case 0, 1:
			m.out(modelInside(a, a>>2), modelRemotes[b%len(modelRemotes)])
		case 2:
			ext := netip.AddrPortFrom(ext1, uint16(3000+a%modelPorts))
			m.in(modelRemotes[b%len(modelRemotes)], ext)
		case 3:
			m.advance(1 + a%3)
		}
	}
	m.advance(10)
	if len(m.flows) != 0 {
		m.t.Fatalf("flows left: %d", len(m.flows))
	}
}

func FuzzMappingModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0, 1, 3, 0, 0, 1, 1, 2, 2, 1, 2, 3, 2, 0})
	f.Add([]byte{0, 1, 0, 0, 5, 1, 0, 9, 2, 0, 13, 3, 3, 0, 0, 0, 1, 0, 3, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		newModel(t).run(ops)
	})
}

// The model run on long random sequences, as the fuzzer's seeds are short.
func TestMappingModel(t *testing.T) {
	for seed := range 8 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		ops := make([]byte, 3*3000)
		for i := range ops {
			ops[i] = byte(r.IntN(256))
		}
		newModel(t).run(ops)
	}
}
