package hash4_test

import (
	"errors"
	"expvar"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hash4/hash4"
)

// natMapping is what a NAT gateway keeps per flow: the public address and
// port it rewrote the flow to, and a packet count.
type natMapping struct {
	Public  netip.AddrPort
	Packets int
}

func ExampleTable() {
	flows := hash4.New[natMapping](hash4.WithCapacity(1 << 12))

	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.168.1.20:51000"),
		Remote: netip.MustParseAddrPort("93.184.216.34:443"),
	}
	m := &natMapping{Public: netip.MustParseAddrPort("203.0.113.1:40001")}
	if err := flows.Insert(flow, m); err != nil {
		fmt.Println("insert:", err)
	}

	// A second insert of the same flow is refused.
	err := flows.Insert(flow, &natMapping{})
	fmt.Println("again:", errors.Is(err, hash4.ErrExists))

	// Per packet: find the mapping and use it.
	if got, ok := flows.Lookup(flow); ok {
		got.Packets++
		fmt.Println("rewrite to", got.Public, "packets", got.Packets)
	}

	// The flow ends.
	gone, ok := flows.Delete(flow)
	fmt.Println("deleted:", ok, gone.Public, "entries left:", flows.Len())
	// Output:
	// again: true
	// rewrite to 203.0.113.1:40001 packets 1
	// deleted: true 203.0.113.1:40001 entries left: 0
}

func ExampleTable_Lookup() {
	t := hash4.New[string]()
	v4 := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:8080"),
		Remote: netip.MustParseAddrPort("10.0.0.2:55555"),
	}
	session := "web session"
	t.Insert(v4, &session)

	// The IPv4-mapped form of the same flow, as a dual-stack socket sees
	// it, is the same key.
	mapped := hash4.Tuple{
		Local:  netip.MustParseAddrPort("[::ffff:10.0.0.1]:8080"),
		Remote: netip.MustParseAddrPort("[::ffff:10.0.0.2]:55555"),
	}
	if v, ok := t.Lookup(mapped); ok {
		fmt.Println(*v)
	}

	other := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:8080"),
		Remote: netip.MustParseAddrPort("10.0.0.3:55555"),
	}
	_, ok := t.Lookup(other)
	fmt.Println("other flow found:", ok)
	// Output:
	// web session
	// other flow found: false
}

// A gateway that reads packets in bursts looks up their flows in one call,
// reusing the slice of values from burst to burst.
func ExampleTable_AppendLookups() {
	t := hash4.New[string]()
	flow := func(remote string) hash4.Tuple {
		r := netip.MustParseAddrPort(remote)
		local := netip.MustParseAddr("192.0.2.1")
		if r.Addr().Is6() {
			local = netip.MustParseAddr("2001:db8::1")
		}
		return hash4.Tuple{Local: netip.AddrPortFrom(local, 443), Remote: r}
	}
	a, b := "session A", "session B"
	if err := t.Insert(flow("198.51.100.7:40000"), &a); err != nil {
		panic(err)
	}
	if err := t.Insert(flow("[2001:db8::9]:40001"), &b); err != nil {
		panic(err)
	}

	var sessions []*string
	burst := []hash4.Tuple{
		flow("[2001:db8::9]:40001"),
		flow("198.51.100.8:40002"), // no such flow
		flow("198.51.100.7:40000"),
	}
	sessions = t.AppendLookups(sessions[:0], burst)
	for i, s := range sessions {
		if s == nil {
			fmt.Println(burst[i].Remote, "-> new flow")
			continue
		}
		fmt.Println(burst[i].Remote, "->", *s)
	}
	// Output:
	// [2001:db8::9]:40001 -> session B
	// 198.51.100.8:40002 -> new flow
	// 198.51.100.7:40000 -> session A
}

func ExampleTable_All() {
	t := hash4.New[int]()
	for i, remote := range []string{"[2001:db8::2]:443", "[2001:db8::3]:443", "[2001:db8::4]:80"} {
		t.Insert(hash4.Tuple{
			Local:  netip.MustParseAddrPort("[2001:db8::1]:40000"),
			Remote: netip.MustParseAddrPort(remote),
		}, &i)
	}
	// All yields in bucket order, which depends on the table's secret:
	// sort for a stable listing.
	var lines []string
	for tup, v := range t.All() {
		lines = append(lines, fmt.Sprintf("%v = %d", tup, *v))
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// [2001:db8::1]:40000->[2001:db8::2]:443 = 0
	// [2001:db8::1]:40000->[2001:db8::3]:443 = 1
	// [2001:db8::1]:40000->[2001:db8::4]:80 = 2
}

func ExampleTable_LookupOrInsert() {
	sessions := hash4.New[string]()
	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:53"),
		Remote: netip.MustParseAddrPort("192.0.2.7:40000"),
	}
	// Two packets of a new flow, handled on two goroutines, each offer a
	// session: one creates the flow, the other gets the same session.
	for _, offer := range []string{"session A", "session B"} {
		s, found, err := sessions.LookupOrInsert(flow, &offer)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(*s, "found:", found)
	}
	// Output:
	// session A found: false
	// session A found: true
}

func ExampleTable_CompareAndDelete() {
	flows := hash4.New[natMapping]()
	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.168.1.20:51000"),
		Remote: netip.MustParseAddrPort("93.184.216.34:443"),
	}
	old := &natMapping{Public: netip.MustParseAddrPort("203.0.113.1:40001")}
	flows.Insert(flow, old)

	// An idle-timeout reaper picked old to expire; meanwhile the flow
	// closed and the client opened a new one on the same 4-tuple.
	flows.Delete(flow)
	flows.Insert(flow, &natMapping{Public: netip.MustParseAddrPort("203.0.113.1:40002")})

	// Deleting with the old value leaves the new flow alone.
	fmt.Println("expired:", flows.CompareAndDelete(flow, old))
	cur, _ := flows.Lookup(flow)
	fmt.Println("current:", cur.Public)
	// Output:
	// expired: false
	// current: 203.0.113.1:40002
}

func ExampleTable_CompareAndSwap() {
	type conn struct{ state string }
	conns := hash4.New[conn]()
	tup := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.0.2.10:80"),
		Remote: netip.MustParseAddrPort("198.51.100.7:50000"),
	}
	timeWait := &conn{state: "TIME_WAIT"}
	conns.Insert(tup, timeWait)

	// A new SYN on the same 4-tuple: the connection it opens takes the
	// TIME_WAIT socket's place, and segments that arrive meanwhile find
	// the one or the other, never neither.
	fmt.Println("took over:", conns.CompareAndSwap(tup, timeWait, &conn{state: "SYN_RECV"}))
	// A second SYN handled at the same time loses the race.
	fmt.Println("took over again:", conns.CompareAndSwap(tup, timeWait, &conn{state: "SYN_RECV"}))
	cur, _ := conns.Lookup(tup)
	fmt.Println("current:", cur.state)
	// Output:
	// took over: true
	// took over again: false
	// current: SYN_RECV
}

func ExampleTable_Store() {
	routes := hash4.New[string]()
	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:8080"),
		Remote: netip.MustParseAddrPort("192.0.2.7:40000"),
	}
	backend := "10.1.0.5:80"
	routes.Store(flow, &backend) // the flow is new: inserted
	moved := "10.1.0.6:80"
	routes.Store(flow, &moved) // the backend moved: replaced in place
	cur, _ := routes.Lookup(flow)
	fmt.Println(*cur, routes.Len())
	// Output:
	// 10.1.0.6:80 1
}

func ExampleTable_Swap() {
	type conn struct{ id int }
	conns := hash4.New[conn]()
	tup := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.0.2.10:80"),
		Remote: netip.MustParseAddrPort("198.51.100.7:50000"),
	}
	for id := 1; id <= 2; id++ {
		// A rebind: the new connection takes the 4-tuple, and the old
		// one, if any, comes back to be closed.
		old, loaded, err := conns.Swap(tup, &conn{id: id})
		if err != nil {
			fmt.Println(err)
			return
		}
		if loaded {
			fmt.Println("close connection", old.id)
		} else {
			fmt.Println("no connection before", id)
		}
	}
	// Output:
	// no connection before 1
	// close connection 1
}

func ExampleTable_Compute() {
	type counter struct{ packets int }
	flows := hash4.New[counter]()
	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:53"),
		Remote: netip.MustParseAddrPort("192.0.2.7:40000"),
	}
	// Count packets, creating the flow on the first: f sees the current
	// value and returns the next, atomically with other writers of flow.
	count := func(old *counter, loaded bool) (*counter, hash4.ComputeOp) {
		if !loaded {
			return &counter{packets: 1}, hash4.UpdateOp
		}
		return &counter{packets: old.packets + 1}, hash4.UpdateOp
	}
	for range 3 {
		flows.Compute(flow, count)
	}
	c, _ := flows.Lookup(flow)
	fmt.Println("packets:", c.packets)

	// Expire the flow only if it is quiet, in the same atomic step.
	_, present, _ := flows.Compute(flow, func(old *counter, loaded bool) (*counter, hash4.ComputeOp) {
		if loaded && old.packets < 10 {
			return nil, hash4.DeleteOp
		}
		return old, hash4.CancelOp
	})
	fmt.Println("present:", present)
	// Output:
	// packets: 3
	// present: false
}

func ExampleTable_LookupOrCompute() {
	type session struct{ id int }
	sessions := hash4.New[session]()
	flow := hash4.Tuple{
		Local:  netip.MustParseAddrPort("10.0.0.1:53"),
		Remote: netip.MustParseAddrPort("192.0.2.7:40000"),
	}
	nextID := 100
	build := func() (*session, error) {
		// Runs only for a flow not seen yet: the session is built once.
		nextID++
		return &session{id: nextID}, nil
	}
	for range 2 {
		s, loaded, err := sessions.LookupOrCompute(flow, build)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("session", s.id, "loaded:", loaded)
	}
	// Output:
	// session 101 loaded: false
	// session 101 loaded: true
}

func ExampleTable_DeleteFunc() {
	type flow struct{ lastSeen time.Time }
	flows := hash4.New[flow]()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for i, age := range []time.Duration{time.Second, 5 * time.Minute, 10 * time.Minute} {
		flows.Insert(hash4.Tuple{
			Local:  netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(40000+i)),
			Remote: netip.MustParseAddrPort("192.0.2.7:443"),
		}, &flow{lastSeen: now.Add(-age)})
	}
	// The reaper's sweep: every flow idle for more than a minute goes.
	n := flows.DeleteFunc(func(_ hash4.Tuple, f *flow) bool {
		return now.Sub(f.lastSeen) > time.Minute
	})
	fmt.Println("reaped:", n, "left:", flows.Len())
	// Output:
	// reaped: 2 left: 1
}

func ExampleTable_Clear() {
	flows := hash4.New[int]()
	for i := range 3 {
		flows.Insert(hash4.Tuple{
			Local:  netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(40000+i)),
			Remote: netip.MustParseAddrPort("192.0.2.7:443"),
		}, &i)
	}
	// The uplink went down: every flow goes, the table stays ready.
	flows.Clear()
	fmt.Println(flows.Len())
	// Output:
	// 0
}

func ExampleTable_Grow() {
	// A table grows itself as flows arrive (see ExampleTable_growth). A
	// gateway that knows a load is coming, such as the 1000 flows of a
	// failover peer, sizes the table ahead instead, so that the inserts
	// find it at its size; a table made WithFixedBuckets grows only this
	// way. Lookups and writes on other goroutines go on during Grow.
	flows := hash4.New[natMapping](hash4.WithCapacity(256), hash4.WithFixedBuckets())
	if err := flows.Grow(1000); err != nil {
		fmt.Println("grow:", err)
	}
	client := netip.MustParseAddr("192.168.1.20")
	upstream := netip.MustParseAddrPort("93.184.216.34:443")
	for port := uint16(10000); port < 11000; port++ {
		flow := hash4.Tuple{Local: netip.AddrPortFrom(client, port), Remote: upstream}
		if err := flows.Insert(flow, &natMapping{}); err != nil {
			fmt.Println("insert:", err)
		}
	}
	st := flows.Stats()
	fmt.Println("flows", st.Entries, "buckets", st.Buckets)
	// Output:
	// flows 1000 buckets 1024
}

func ExampleTable_Compact() {
	// A burst of 16000 flows, four per bucket, of which all but 1000 end:
	// the table keeps the nodes the burst took beyond its buckets' lines, to
	// reuse them, until Compact gives them back to the heap.
	flows := hash4.New[natMapping](hash4.WithCapacity(4096), hash4.WithFixedBuckets())
	upstream := netip.MustParseAddrPort("93.184.216.34:443")
	flow := func(i int) hash4.Tuple {
		client := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		return hash4.Tuple{Local: netip.AddrPortFrom(client, 40000), Remote: upstream}
	}
	for i := range 16000 {
		if err := flows.Insert(flow(i), &natMapping{}); err != nil {
			fmt.Println("insert:", err)
		}
	}
	for i := 1000; i < 16000; i++ {
		flows.Delete(flow(i))
	}
	before := flows.Stats().Nodes
	flows.Compact()
	after := flows.Stats().Nodes
	fmt.Println("flows", flows.Len(), "nodes halved:", after < before/2)
	// Output:
	// flows 1000 nodes halved: true
}

func ExampleTable_growth() {
	// A table made for 128 flows that gets 2000 grows itself past about
	// two flows per bucket: the insert that finds it too full starts its
	// growth on a goroutine of the table's own and returns, and lookups
	// find every flow while the entries move.
	flows := hash4.New[natMapping](hash4.WithCapacity(128))
	client := netip.MustParseAddr("192.168.1.20")
	upstream := netip.MustParseAddrPort("93.184.216.34:443")
	flow := func(port uint16) hash4.Tuple {
		return hash4.Tuple{Local: netip.AddrPortFrom(client, port), Remote: upstream}
	}
	for port := uint16(10000); port < 12000; port++ {
		if err := flows.Insert(flow(port), &natMapping{}); err != nil {
			fmt.Println("insert:", err)
		}
	}
	found := 0
	for port := uint16(10000); port < 12000; port++ {
		if _, ok := flows.Lookup(flow(port)); ok {
			found++
		}
	}
	fmt.Println("flows", flows.Len(), "found", found)
	// Output:
	// flows 2000 found 2000
}

func ExampleTable_Connect() {
	flows := hash4.New[natMapping]()
	ports, err := hash4.NewPortAllocator(
		hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40003}),
		hash4.WithPolicy(hash4.Flat),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	local := netip.MustParseAddr("203.0.113.1")
	dns := netip.MustParseAddrPort("198.51.100.53:53")

	// Each Connect picks a port that makes the 4-tuple unique and inserts
	// the flow, in one step.
	used := map[uint16]bool{}
	for range 4 {
		tup, err := flows.Connect(ports, local, dns, &natMapping{})
		if err != nil {
			fmt.Println(err)
			return
		}
		used[tup.Local.Port()] = true
	}
	fmt.Println("ports used toward", dns, "->", len(used))

	// The range is spent toward that destination...
	_, err = flows.Connect(ports, local, dns, &natMapping{})
	fmt.Println("fifth:", errors.Is(err, hash4.ErrNoPorts))

	// ...but not toward another: a port is taken per 4-tuple.
	tup, err := flows.Connect(ports, local, netip.MustParseAddrPort("198.51.100.54:53"), &natMapping{})
	fmt.Println("other destination:", err == nil, used[tup.Local.Port()])
	// Output:
	// ports used toward 198.51.100.53:53 -> 4
	// fifth: true
	// other destination: true true
}

// A NAT gateway binds the outside socket of each new flow in ConnectFunc's
// function, with the port ConnectFunc offers: lookups see the flow only once
// its socket is ready, and a port the system refuses is skipped.
func ExampleTable_ConnectFunc() {
	type flow struct {
		outside hash4.Tuple // the flow's own 4-tuple, recorded before anyone sees it
	}
	flows := hash4.New[flow]()
	ports, err := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40009}))
	if err != nil {
		fmt.Println(err)
		return
	}
	busy := map[uint16]bool{}             // ports the system will not bind, found as we go
	bind := func(tup hash4.Tuple) error { // stands in for a socket's bind
		if len(busy) == 0 {
			busy[tup.Local.Port()] = true
			return fmt.Errorf("bind %v: %w", tup.Local, hash4.ErrPortRefused)
		}
		return nil
	}
	tup, f, err := flows.ConnectFunc(ports, netip.MustParseAddr("203.0.113.1"), netip.MustParseAddrPort("93.184.216.34:443"),
		func(tup hash4.Tuple) (*flow, error) {
			if err := bind(tup); err != nil {
				return nil, err
			}
			return &flow{outside: tup}, nil
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	got, _ := flows.Lookup(tup)
	fmt.Println(got == f, f.outside == tup, busy[tup.Local.Port()], len(busy))
	// Output:
	// true true false 1
}

// A port another program holds is refused call after call, as the allocator
// cannot see that program's socket. A gateway that holds a refused port with
// Bind keeps Connect and ConnectFunc off it, and releases the hold after a
// while, when the port may be free again.
func ExampleTable_ConnectFunc_holdRefused() {
	type flow struct{ outside hash4.Tuple }
	flows := hash4.New[flow]()
	ports, err := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40007}))
	if err != nil {
		fmt.Println(err)
		return
	}
	local := netip.MustParseAddr("203.0.113.1")
	upstream := netip.MustParseAddrPort("93.184.216.34:443")
	const elsewhere = 40004 // another program's port: the system refuses it
	offered := 0
	for range 10 { // 7 flows, then the range is spent
		var refused []uint16
		_, _, err := flows.ConnectFunc(ports, local, upstream, func(tup hash4.Tuple) (*flow, error) {
			if tup.Local.Port() == elsewhere { // stands in for a socket's bind
				offered++
				refused = append(refused, tup.Local.Port())
				return nil, fmt.Errorf("bind %v: %w", tup.Local, hash4.ErrPortRefused)
			}
			return &flow{outside: tup}, nil
		})
		// Hold what the system refused, once ConnectFunc has returned.
		for _, p := range refused {
			if release, err := ports.Bind(netip.AddrPortFrom(local, p)); err == nil {
				time.AfterFunc(time.Minute, release) // then try the port again
			}
		}
		if err != nil && !errors.Is(err, hash4.ErrNoPorts) {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("flows:", flows.Len())
	// Without the hold, the calls that reach the port in their scan, most
	// of the ten, would each be offered it.
	fmt.Println("calls offered the refused port:", offered)
	fmt.Println("refusals counted:", flows.Metrics().ConnectRefused)
	// Output:
	// flows: 7
	// calls offered the refused port: 1
	// refusals counted: 1
}

// A gateway publishes its flow table's counters with expvar, where
// /debug/vars serves them; here under a map of its own, as a program would
// with expvar.Publish("flows", ...).
func ExampleTable_Metrics() {
	flows := hash4.New[int](hash4.WithCapacity(64))
	ports, err := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40001}))
	if err != nil {
		fmt.Println(err)
		return
	}
	vars := new(expvar.Map).Init()
	vars.Set("flows", expvar.Func(func() any { return flows.Metrics() }))

	remote := netip.MustParseAddrPort("192.0.2.7:443")
	for range 3 { // the third finds no port
		flows.Connect(ports, netip.MustParseAddr("10.0.0.1"), remote, new(int))
	}
	m := flows.Metrics()
	fmt.Println("entries:", m.Entries, "connects:", m.Connects, "no ports:", m.ConnectNoPorts)
	fmt.Println(strings.Contains(vars.String(), `"ConnectNoPorts":1`))
	// Output:
	// entries: 2 connects: 3 no ports: 1
	// true
}

func ExamplePortAllocator_Bind() {
	ports, err := hash4.NewPortAllocator()
	if err != nil {
		fmt.Println(err)
		return
	}
	// A server socket holds its port: Connect will not hand it out.
	release, err := ports.Bind(netip.MustParseAddrPort("0.0.0.0:8080"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = ports.Bind(netip.MustParseAddrPort("192.0.2.1:8080"))
	fmt.Println("second bind:", errors.Is(err, hash4.ErrPortInUse))

	release()
	_, err = ports.Bind(netip.MustParseAddrPort("192.0.2.1:8080"))
	fmt.Println("after release:", err)
	// Output:
	// second bind: true
	// after release: <nil>
}

// A program that binds ports as well as connecting makes its flow table with
// WithPortAllocator: BindEphemeral and Bind then see the ports its flows
// use. A table made without it is invisible to them.
func ExamplePortAllocator_BindEphemeral() {
	local := netip.MustParseAddr("203.0.113.1")
	upstream := netip.MustParseAddrPort("198.51.100.7:443")
	onePort := hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40000})

	ports, err := hash4.NewPortAllocator(onePort)
	if err != nil {
		fmt.Println(err)
		return
	}
	flows := hash4.New[int](hash4.WithPortAllocator(ports))
	tup, err := flows.Connect(nil, local, upstream, new(int)) // nil: the table's allocator
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _, err = ports.BindEphemeral(local)
	fmt.Println("flow on", tup.Local.Port(), "- BindEphemeral finds no port:", errors.Is(err, hash4.ErrNoPorts))

	// The same with a table made without WithPortAllocator: BindEphemeral
	// hands out the port the flow uses.
	unseen, err := hash4.NewPortAllocator(onePort)
	if err != nil {
		fmt.Println(err)
		return
	}
	tup, err = hash4.New[int]().Connect(unseen, local, upstream, new(int))
	if err != nil {
		fmt.Println(err)
		return
	}
	port, release, err := unseen.BindEphemeral(local)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer release()
	fmt.Println("flow on", tup.Local.Port(), "- BindEphemeral returns", port)
	// Output:
	// flow on 40000 - BindEphemeral finds no port: true
	// flow on 40000 - BindEphemeral returns 40000
}

func ExampleParsePortRange() {
	// The sysctl's own form, as /proc/sys/net/ipv4/ip_local_port_range reads.
	r, err := hash4.ParsePortRange("32768\t60999\n")
	fmt.Println(r, r.Size(), err)

	r, err = hash4.ParsePortRange("20000-20999")
	if err != nil {
		fmt.Println(err)
		return
	}
	ports, err := hash4.NewPortAllocator(hash4.WithPortRange(r))
	fmt.Println(ports.Range() == r, err)

	_, err = hash4.ParsePortRange("60999-32768")
	fmt.Println(errors.Is(err, hash4.ErrInvalidPortRange))
	// Output:
	// {32768 60999} 28232 <nil>
	// true <nil>
	// true
}

func ExampleTCPTable() {
	type sock struct{ name string }
	socks := hash4.NewTCPTable[sock]()
	if _, err := socks.Listen(netip.MustParseAddrPort("0.0.0.0:443"), &sock{"listener"}); err != nil {
		fmt.Println(err)
		return
	}
	// An accepted connection, as the segment that arrives for it names
	// it: Local is the receiving end.
	conn := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.0.2.10:443"),
		Remote: netip.MustParseAddrPort("198.51.100.7:50000"),
	}
	if err := socks.Established().Insert(conn, &sock{"connection"}); err != nil {
		fmt.Println(err)
		return
	}

	for _, from := range []string{"198.51.100.7:50000", "198.51.100.8:50000"} {
		s, _ := socks.Lookup(hash4.Tuple{Local: conn.Local, Remote: netip.MustParseAddrPort(from)})
		fmt.Println(from, "->", s.name)
	}
	// Output:
	// 198.51.100.7:50000 -> connection
	// 198.51.100.8:50000 -> listener
}

func ExampleTCPTable_LookupKind() {
	conns := hash4.NewTCPTable[string]()
	listener, conn := "web listener", "connection"
	release, err := conns.Listen(netip.MustParseAddrPort("0.0.0.0:80"), &listener)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer release()
	seg := hash4.Tuple{
		Local:  netip.MustParseAddrPort("192.0.2.10:80"),
		Remote: netip.MustParseAddrPort("198.51.100.7:50000"),
	}
	for range 2 {
		v, kind, _ := conns.LookupKind(seg)
		switch kind {
		case hash4.KindListener: // a SYN: accept it, and the flow is established
			fmt.Println("listener:", *v)
			conns.Established().Insert(seg, &conn)
		case hash4.KindEstablished:
			fmt.Println("established:", *v)
		}
	}
	// Output:
	// listener: web listener
	// established: connection
}

func ExampleTCPTable_Listen() {
	// Four workers listen on one address and port with SO_REUSEPORT; each
	// new connection's SYN goes to the worker its 4-tuple hashes to.
	type worker struct{ id int }
	socks := hash4.NewTCPTable[worker]()
	addr := netip.MustParseAddrPort("192.0.2.10:443")
	release := make([]func(), 4)
	for i := range release {
		var err error
		if release[i], err = socks.Listen(addr, &worker{i}, hash4.WithReusePort()); err != nil {
			fmt.Println(err)
			return
		}
	}
	syn := func(i int) hash4.Tuple {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), uint16(40000+i))
		return hash4.Tuple{Local: addr, Remote: client}
	}
	taken := make([]int, 4)
	for i := range 1000 {
		w, _ := socks.Lookup(syn(i))
		taken[w.id]++
	}
	fmt.Println("every worker takes connections:", !slices.Contains(taken, 0))

	// Worker 1 stops listening; its share goes to the others.
	release[1]()
	clear(taken)
	for i := range 1000 {
		w, _ := socks.Lookup(syn(i))
		taken[w.id]++
	}
	fmt.Println("connections for worker 1:", taken[1])
	// Output:
	// every worker takes connections: true
	// connections for worker 1: 0
}

func ExampleUDPTable() {
	type sock struct{ name string }
	socks := hash4.NewUDPTable[sock]()
	// SO_REUSEADDR on both lets a socket on the wildcard address and one on
	// a concrete address share the port, as in Linux.
	if _, err := socks.Bind(netip.MustParseAddrPort("0.0.0.0:5353"), &sock{"wildcard"}, hash4.WithReuseAddr()); err != nil {
		fmt.Println(err)
		return
	}
	// A socket bound to one address of the same port and connected to one
	// peer.
	s, err := socks.Bind(netip.MustParseAddrPort("192.0.2.10:5353"), &sock{"connected"}, hash4.WithReuseAddr())
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := s.Connect(netip.MustParseAddrPort("198.51.100.7:5353")); err != nil {
		fmt.Println(err)
		return
	}

	for _, from := range []string{"198.51.100.7:5353", "198.51.100.8:5353"} {
		got, _ := socks.Lookup(hash4.Tuple{
			Local:  netip.MustParseAddrPort("192.0.2.10:5353"),
			Remote: netip.MustParseAddrPort(from),
		})
		fmt.Println(from, "->", got.name)
	}
	// Output:
	// 198.51.100.7:5353 -> connected
	// 198.51.100.8:5353 -> wildcard
}

func ExampleUDPTable_Bind() {
	// A DNS server binds a socket per thread on one port with
	// SO_REUSEPORT; each client's datagrams go to the socket its 4-tuple
	// hashes to, always the same one while the group does not change.
	type thread struct{ id int }
	socks := hash4.NewUDPTable[thread]()
	group := make([]*hash4.UDPSocket[thread], 4)
	for i := range group {
		var err error
		if group[i], err = socks.Bind(netip.MustParseAddrPort("0.0.0.0:53"), &thread{i}, hash4.WithReusePort()); err != nil {
			fmt.Println(err)
			return
		}
	}
	query := func(i int) hash4.Tuple {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), uint16(40000+i))
		return hash4.Tuple{Local: netip.MustParseAddrPort("192.0.2.53:53"), Remote: client}
	}
	first, _ := socks.Lookup(query(7))
	again, _ := socks.Lookup(query(7))
	fmt.Println("a client stays with its thread:", first == again)
	taken := make([]int, 4)
	for i := range 1000 {
		th, _ := socks.Lookup(query(i))
		taken[th.id]++
	}
	fmt.Println("every thread takes queries:", !slices.Contains(taken, 0))

	// Thread 2 closes its socket; its share goes to the others.
	if err := group[2].Close(); err != nil {
		fmt.Println(err)
		return
	}
	clear(taken)
	for i := range 1000 {
		th, _ := socks.Lookup(query(i))
		taken[th.id]++
	}
	fmt.Println("queries for thread 2:", taken[2])
	// Output:
	// a client stays with its thread: true
	// every thread takes queries: true
	// queries for thread 2: 0
}
