// Package hash4 is a concurrent hash table keyed by network 4-tuples (local
// address and port, remote address and port), built the way Linux builds
// its socket tables, for proxies, NAT gateways and user-space network
// stacks that map flows to state at packet rate.
//
// [Table] maps a [Tuple] to a *T. Lookups take no lock and never allocate;
// writers lock one stripe of the table; deleted entries are recycled
// without allocation. [Table.AppendLookups] looks up a burst of tuples with
// their memory misses overlapped.
//
// [Table.Connect] picks a free ephemeral source port for a new outbound
// flow and inserts the flow in one step, as Linux's connect() does, with
// the RFC 6056 double hash and its perturb table. A [PortAllocator] holds
// the port range, the odd/even or flat policy, the reserved ports and the
// ports held by [PortAllocator.Bind].
//
// [UDPTable] and [TCPTable] find the socket a packet belongs to, with the
// kernel's lookup order: UDP's bound and connected sockets, TCP's
// established flows, then listeners.
//
// The hash functions are bit-exact with Linux: [JHash] and its word forms,
// [InetEhashfn], [Inet6Ehashfn], [UDPEhashfn], [UDP6Ehashfn],
// [IPv4PortaddrHash] and [IPv6PortaddrHash]. [HashTuple] hashes a Tuple as
// a Table does.
//
// # Memory ordering
//
// Lock-free readers load shared fields with sync/atomic. Writers, one at a
// time under a lock, store them with release stores: on amd64 a release
// store is a plain store, as every x86 store is one (the kernel's
// smp_store_release does the same), where a sync/atomic store is a full
// fence that costs several times more. Race builds, other architectures,
// and builds with the tag hash4_atomicstores use sync/atomic stores
// everywhere; a cautious user can build with
//
//	go build -tags hash4_atomicstores
//
// to take the Go memory model's guarantees rather than the processor's.
package hash4
