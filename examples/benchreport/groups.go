package main

// groupSpec describes one comparison: which benchmark function runs it, which
// part of the sub-benchmark name names the implementations compared, and how
// it is charted.
type groupSpec struct {
	name  string // flag name: lookup, mixed, churn, batch, turnover, zipf, natmix, uniform, writes, burst, sharing, connect, udp
	bench string // benchmark function, e.g. BenchmarkLookup
	title string // heading and chart title
	// implKey is the sub-name key whose values are the implementations
	// compared (a column each). Its values are shown bare if the key is
	// "impl", else as key=value (hash4=on).
	implKey string
	// impls are the implementations in the order shown, the one whose
	// ratio is the headline first; any others found are appended.
	impls []string
	// variants are other forms of the headline implementation (hash4's
	// loop of Lookup beside its AppendLookups): shown, but not its peers,
	// so the headline does not compare with them.
	variants []string
	// dir is the package that holds bench, relative to the repository's
	// root: peersDir for the comparisons with other maps, "" for the root
	// package. Sized groups are all in peersDir.
	dir string
	// sized groups run at the -sizes (sub-name n=) and at every -cpu count
	// and are charted as throughput against goroutines, one chart per
	// size. Others run once at GOMAXPROCS.
	sized bool
	// xKey, if set, is the sub-name key charted on the x axis (Connect's
	// occupancy), one chart per value of the other keys.
	xKey string
	// processPerImpl groups run each implementation in a test process of
	// its own, as the traffic benchmarks ask: a process fills 1M flows,
	// and one implementation's heap and GC must not weigh on the next's.
	// levels is then the -test.bench pattern of the sub-name levels above
	// impl=, e.g. "^n=1M$".
	processPerImpl bool
	levels         string
	// slow groups are left out of -quick unless -groups names them: the
	// traffic benchmarks fill 1M flows whatever -sizes says.
	slow bool
	// perRow is the number of results per run (per count) for each size,
	// -cpu value or Connect policy, or of all implementations of a
	// processPerImpl group; used for the progress bar's total.
	perRow int
	// what says what the operation is; meaning says in one sentence what
	// the comparison means for a NAT gateway or proxy.
	what, meaning string
}

// headline is the implementation whose ratio to its fastest peer is the
// headline of a row.
func (g *groupSpec) headline() string { return g.impls[0] }

// connectPolicies are the port-selection policies BenchmarkConnect runs;
// used only to size the progress bar when -policies is not given.
var connectPolicies = []string{"odd-even", "flat"}

// connectOccupancies is the number of occupancies BenchmarkConnect runs
// (0, 50, 90, 99 and 99.9%).
const connectOccupancies = 5

// connectRootImpls are the Connect strategies the report runs in the root
// package's BenchmarkConnect, as they are unexported: the kernel's scan,
// which Connect used before it found a busy destination's ports in a
// bitmap, and older steps. Connect itself (hash4) and its map baseline
// (xsync) run in bench/.
var connectRootImpls = []string{"scan", "rehash", "locked"}

var groupSpecs = []*groupSpec{
	{
		name: "lookup", bench: "BenchmarkLookup", title: "Lookup hits",
		implKey: "impl", impls: []string{"hash4", "syncmap", "xsync", "rwmutex", "cmap"},
		sized: true, perRow: 5,
		what: "Lookups of keys present in the table, by every goroutine at once.",
		meaning: "Every packet a NAT gateway or proxy forwards first looks up its flow, so this cost " +
			"bounds packets per second, and the goroutine axis shows whether more cores forward more packets.",
	},
	{
		name: "mixed", bench: "BenchmarkMixed", title: "Mixed: 90% lookups, 10% delete+insert",
		implKey: "impl", impls: []string{"hash4", "syncmap", "xsync", "rwmutex", "cmap"},
		sized: true, perRow: 5,
		what: "Nine lookups to one delete+insert of the same key; the table stays full.",
		meaning: "A loaded gateway mostly forwards packets of known flows while some flows open and close; " +
			"this is the per-packet cost when writers run beside the readers.",
	},
	{
		name: "churn", bench: "BenchmarkChurn", title: "Churn: delete+insert",
		implKey: "impl", impls: []string{"hash4", "syncmap", "xsync", "rwmutex", "cmap"},
		sized: true, perRow: 5,
		what: "Delete and reinsert of present keys only (two operations per op).",
		meaning: "Short flows (DNS, HTTP/1.0, a SYN flood) are all setup and teardown: this bounds how many " +
			"flows per second a proxy can create and expire, and allocations here become GC pauses under load.",
	},
	{
		name: "batch", bench: "BenchmarkAppendLookups", title: "Lookups in bursts of 16",
		implKey: "impl", impls: []string{"hash4-batch", "hash4", "xsync"}, variants: []string{"hash4"},
		sized: true, perRow: 3,
		what: "Lookups of present keys, 16 at a time: Table.AppendLookups (hash4-batch) against a loop of " +
			"Lookup (hash4) and of xsync's Load; time per lookup.",
		meaning: "A gateway that reads packets in bursts (recvmmsg, AF_XDP) has their tuples at once; looking " +
			"them up together overlaps their memory misses, which is what a table beyond the caches waits on.",
	},
	{
		name: "turnover", bench: "BenchmarkTurnover", title: "Turnover: a cold delete and insert among 1M flows",
		implKey: "impl", impls: trafficImpls, dir: peersDir,
		processPerImpl: true, levels: "^n=1M$", slow: true, perRow: len(trafficImpls),
		what: "Each op deletes a random live flow and inserts a new one, unrelated to it, that left the table " +
			"long ago: both cold. The 1M flows, half IPv4 and half IPv6, are split between the goroutines as " +
			"receive-side scaling splits them between cores.",
		meaning: "Flows on a NAT gateway or proxy do not end in the order they began, and the flow that opens " +
			"next is not the one that just closed: this is what a new flow costs when nothing of it is in the " +
			"caches, and allocations here become GC pauses under load.",
	},
	{
		name: "zipf", bench: "BenchmarkZipf", title: "Zipf lookups among 1M flows",
		implKey: "impl", impls: trafficImpls, dir: peersDir,
		processPerImpl: true, levels: "^n=1M$", slow: true, perRow: len(trafficImpls),
		what: "Lookups of flows drawn from a Zipf law (s = 1.1), the hot flows at random places in the table " +
			"and in memory.",
		meaning: "A few flows carry most of a gateway's packets while most flows idle: this is the per-packet " +
			"cost when the hot flows' lines stay in the caches and the rest miss.",
	},
	{
		name: "natmix", bench: "BenchmarkNATMix", title: "NAT mix: 98 Zipf lookups to one turnover",
		implKey: "impl", impls: trafficImpls, dir: peersDir,
		processPerImpl: true, levels: "^n=1M$", slow: true, perRow: len(trafficImpls),
		what: "Of every 100 ops, 98 Zipf lookups and one turnover (its delete and its insert, one op each), " +
			"among 1M flows.",
		meaning: "A NAT gateway forwards the packets of its flows while new flows replace old ones: this is its " +
			"per-packet cost with the writes among the reads, as a NAT's traffic mixes them.",
	},
	{
		name: "uniform", bench: "BenchmarkUniform", title: "Uniform lookups among 1M flows",
		implKey: "impl", impls: trafficImpls, dir: peersDir,
		processPerImpl: true, levels: "^n=1M$", slow: true, perRow: len(trafficImpls),
		what: "Lookups of every flow in turn, in a random order, among 1M flows split between the goroutines.",
		meaning: "A gateway whose flows carry traffic evenly (many similar clients) finds every flow as cold as " +
			"the next: this is the per-packet cost when the caches hold almost none of the table.",
	},
	{
		name: "writes", bench: "BenchmarkUniformWrites", title: "90% uniform lookups, 10% turnover writes",
		implKey: "impl", impls: trafficImpls, dir: peersDir,
		processPerImpl: true, levels: "^n=1M$", slow: true, perRow: len(trafficImpls),
		what: "Of every 20 ops, 18 uniform lookups and one turnover (its delete and its insert, one op each), " +
			"among 1M flows.",
		meaning: "Flows that open and close often (short connections, DNS) make a tenth of a gateway's table " +
			"operations writes: this is the per-packet cost with the writers among the readers.",
	},
	{
		name: "burst", bench: "BenchmarkBurst", title: "Bursts of 16 among 1M flows",
		implKey: "impl", impls: append([]string{"hash4-batch"}, trafficImpls...), variants: []string{"hash4"},
		dir: peersDir, processPerImpl: true, levels: "^n=1M$/.", slow: true, perRow: 2 * (1 + len(trafficImpls)), // mix=uniform and nat
		what: "Lookups 16 at a time, of uniformly random flows (mix=uniform) or as in the NAT mix (mix=nat, " +
			"the turnover between bursts): Table.AppendLookups (hash4-batch) against loops of Lookup (hash4) " +
			"and of each peer's lookup, the RWMutex map's under one RLock per burst; time per lookup (or write).",
		meaning: "A gateway that reads packets in bursts (recvmmsg, AF_XDP) has their tuples at once: this is " +
			"what looking them up together saves on real traffic, where the flows of a burst are scattered " +
			"over a table far beyond the caches.",
	},
	{
		name: "sharing", bench: "BenchmarkChurnSharing", title: "Churn: one shared table or one per goroutine",
		implKey: "tables", impls: []string{"tables=shared", "tables=own"}, dir: peersDir,
		perRow: 4,
		what: "Delete and reinsert of present keys (1K or 1M) by every goroutine, in one table they share or each " +
			"in a table of its own that holds the same keys: the same work per op either way.",
		meaning: "What sharing costs is the cache lines passed between the cores that write them. On a VM this " +
			"also tells where the processors sat during the report: when tables of their own cost as much as a " +
			"shared one, the goroutines ran on processors that share a core's caches, and churn above is cheaper than on two cores that do not.",
	},
	{
		name: "connect", bench: "BenchmarkConnect", title: "Connect: pick a free source port",
		implKey: "impl", impls: []string{"hash4", "scan", "rehash", "locked", "xsync"},
		xKey: "occupancy", perRow: 5 * connectOccupancies,
		what: "One Connect to a fixed destination plus one Delete of a random live flow, with the " +
			"ephemeral range 32768-60999 occupied to a fixed fraction. hash4 is Table.Connect, which finds " +
			"a busy destination's free ports in a bitmap; scan is the kernel's walk it used before, a " +
			"lock-free lookup per candidate port; rehash (a full hash per candidate) and locked (no lock-free " +
			"pre-check) are older forms of the walk; xsync runs the walk over an xsync.Map.",
		meaning: "Every new outbound flow of a NAT gateway or proxy needs a free source port toward its " +
			"destination: this is what opening a connection costs as the port range toward a busy upstream fills.",
	},
	{
		name: "udp", bench: "BenchmarkUDPLookup", title: "UDP socket lookup: hash4 on vs off",
		implKey: "hash4", impls: []string{"hash4=on", "hash4=off"},
		perRow: 10,
		what: "Socket lookup of a datagram on a port with 500 connected sockets and one unconnected one " +
			"(connected), on ports with unconnected sockets only, or to a reuseport group of 64 unconnected sockets, " +
			"alone in its hash2 slot or beside a connected socket bound to another address (connected-neighbour).",
		meaning: "A UDP proxy that connects one socket per client on one port finds a datagram's socket " +
			"directly with the 4-tuple hash, instead of scoring every socket on the port, so its cost stops growing with the number of clients; " +
			"a server with a socket per thread on one port pays for a datagram what a single socket costs.",
	},
}

// trafficImpls are the implementations of the traffic groups, hash4 first:
// the peers of tablePeers but cmap, which the traffic benchmarks leave to
// shard256.
var trafficImpls = []string{"hash4", "syncmap", "xsync", "rwmutex", "shard256"}

// tablePeers names the maps that the comparisons run hash4 against, in the
// order of their columns, and says what each is.
var tablePeers = []struct{ name, what string }{
	{"syncmap", "sync.Map"},
	{"xsync", "`github.com/puzpuzpuz/xsync/v4` Map, presized"},
	{"rwmutex", "a map behind one sync.RWMutex, presized"},
	{"cmap", "`github.com/orcaman/concurrent-map/v2`: 32 maps, each behind a sync.RWMutex, " +
		"picked by a maphash of the key"},
	{"shard256", "256 maps, each behind a sync.RWMutex of its own, picked by a seeded hash of the key's words, presized"},
}

// groupByName returns the spec named name, or nil.
func groupByName(name string) *groupSpec {
	for _, g := range groupSpecs {
		if g.name == name {
			return g
		}
	}
	return nil
}

// groupByBench returns the spec of the benchmark function bench, or nil.
func groupByBench(bench string) *groupSpec {
	for _, g := range groupSpecs {
		if g.bench == bench {
			return g
		}
	}
	return nil
}
