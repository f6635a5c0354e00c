package main

// groupSpec describes one comparison: which benchmark function runs it, which
// part of the sub-benchmark name names the implementations compared, and how
// it is charted.
type groupSpec struct {
	name  string // flag name: lookup, mixed, churn, batch, sharing, connect, udp
	bench string // benchmark function, e.g. BenchmarkLookup
	title string // heading and chart title
	// implKey is the sub-name key whose values are the implementations
	// compared (a column each). Its values are shown bare if the key is
	// "impl", else as key=value (hash4=on).
	implKey string
	// impls are the implementations in the order shown, the one whose
	// ratio is the headline first; any others found are appended.
	impls []string
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
	// perRow is the number of results per run (per count) for each size,
	// -cpu value or Connect policy; used for the progress bar's total.
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
		implKey: "impl", impls: []string{"hash4-batch", "hash4", "xsync"},
		sized: true, perRow: 3,
		what: "Lookups of present keys, 16 at a time: Table.AppendLookups (hash4-batch) against a loop of " +
			"Lookup (hash4) and of xsync's Load; time per lookup.",
		meaning: "A gateway that reads packets in bursts (recvmmsg, AF_XDP) has their tuples at once; looking " +
			"them up together overlaps their memory misses, which is what a table beyond the caches waits on.",
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

// tablePeers names the maps that Lookup, Mixed and Churn compare hash4
// with, in the order of their columns, and says what each is.
var tablePeers = []struct{ name, what string }{
	{"syncmap", "sync.Map"},
	{"xsync", "`github.com/puzpuzpuz/xsync/v4` Map, presized"},
	{"rwmutex", "a map behind one sync.RWMutex, presized"},
	{"cmap", "`github.com/orcaman/concurrent-map/v2`: 32 maps, each behind a sync.RWMutex, " +
		"picked by a maphash of the key"},
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
