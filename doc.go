// Package hash4 is a concurrent hash table keyed by network 4-tuples (local
// address and port, remote address and port), built the way Linux builds
// its socket tables, for proxies, NAT gateways and user-space network
// stacks that map flows to state at packet rate.
//
// Table maps a Tuple to a *T. It is the kernel's established-socket table
// (inet_ehash): hlist_nulls chains that lookups walk without locks, ending
// in markers that name their bucket; writers under striped locks; entries
// recycled at once without allocation. Lookup takes no lock and never
// allocates; AppendLookups looks up a burst of tuples with their memory
// misses overlapped. LookupOrInsert, CompareAndSwap and CompareAndDelete
// are the atomic steps of flow setup, takeover and expiry.
//
// Table.Connect picks a free ephemeral source port for a new outbound flow
// and inserts the flow in one step, as the kernel's __inet_hash_connect
// does, with the RFC 6056 double hash and its perturb table. A
// PortAllocator holds the port range, the odd/even or flat policy, the
// reserved ports and the ports held by Bind.
//
// UDPTable and TCPTable demultiplex packets to sockets: UDPTable with the
// kernel's hash2 and hash4 tables for bound and connected UDP sockets,
// TCPTable with established flows, then listeners.
//
// The hash functions are bit-exact with Linux: JHash and its word forms,
// InetEhashfn, Inet6Ehashfn, UDPEhashfn, UDP6Ehashfn, IPv4PortaddrHash and
// IPv6PortaddrHash. HashTuple hashes a Tuple as a Table does, with the
// Linux or the XXH3 Hasher and a Secret.
//
// Keys. An IPv4 address and its IPv4-mapped IPv6 form are the same
// address, and zones are not part of a key; see Table.
package hash4
