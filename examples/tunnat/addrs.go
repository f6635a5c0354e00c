package main

import "net/netip"

// The topology's addresses (topo_linux.go builds it). They exist only
// inside the namespaces this program makes; the NAT's configuration
// (nat.go) names them on every platform, as the flags are checked there too.
var (
	clientAddr4 = netip.MustParseAddr("10.48.0.2")
	serverAddr4 = netip.MustParseAddr("10.48.1.1")
	extAddr4    = netip.MustParseAddr("10.48.1.2") // the NAT's external address
	gwInside4   = netip.MustParseAddr("10.48.0.1") // the kernel gateway's inside address (-compare)
	clientAddr6 = netip.MustParseAddr("fd48::2")
	serverAddr6 = netip.MustParseAddr("fd48:1::1")
	extAddr6    = netip.MustParseAddr("fd48:1::2")
	gwInside6   = netip.MustParseAddr("fd48::1") // the NAT's own inside address (its ICMP errors)
	// A second address of the server, for a STUN server's alternate.
	serverAlt4 = netip.MustParseAddr("10.48.1.100")
	// The second inside host, routed by the client namespace.
	client2Addr4 = netip.MustParseAddr("10.48.2.2")
	client2Addr6 = netip.MustParseAddr("fd48:2::2")
	// A host past the server namespace, which routes to it over a link of
	// MTU farMTU: a hop past the NAT, and a smaller MTU on its far side.
	farAddr4 = netip.MustParseAddr("10.48.3.2")
	farAddr6 = netip.MustParseAddr("fd48:3::2")
)
