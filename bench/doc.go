// Package bench compares hash4's Table with the usual Go concurrent maps
// (xsync, concurrent-map, a map behind a sync.RWMutex and sync.Map) and
// checks the table's histories for linearizability with porcupine.
//
// It is a module of its own, github.com/hash4/hash4/bench, because of what
// these tests import: the maps compared and the checker are modules the
// library itself does not need, and in the library's module they would be
// requirements of every program that imports it. The linearizability test
// lives here rather than in a module of its own for the same reason: it is
// the one other test that needs an outside module, and one module keeps one
// set of requirements and one command. Everything here uses hash4's public
// API only, and the harness it shares with the root package's benchmarks
// (key sets, walks, the Connect benchmarks' state) is the root module's
// internal/benchkit. All code is in _test files but cmd/ratios, the
// command that runs the traffic benchmarks a process per implementation
// and reports hash4's ratios to its peers, and internal/machine, which
// reads the CPU time they used and how busy other work kept the machine;
// see README.md for the commands.
package bench
