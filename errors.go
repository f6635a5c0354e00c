package hash4

import (
	"errors"
	"syscall"
)

// Errors for bad input and for a table's state. Match them with errors.Is:
// the errors returned wrap them with the offending tuple, address or size,
// except ErrTableFull, which is returned as it is.
//
// Bad addresses, ports and tuples, wherever they arise (Table, UDPTable,
// TCPTable, PortAllocator), match both ErrInvalidTuple and ErrInvalidAddr:
// the two names are one error, so code written against either catches them
// all.
var (
	// ErrExists: the 4-tuple is already in the table, or held by a
	// ConnectFunc that has not returned yet.
	ErrExists = errors.New("hash4: 4-tuple already in table")
	// ErrInvalidTuple: an address is invalid or unspecified (0.0.0.0, ::)
	// where a concrete one is needed, a port is 0, or a flow's local and
	// remote addresses are of different families: an IPv4 address and an
	// IPv4-mapped one (::ffff:a.b.c.d) are both IPv4, and go with each
	// other but not with an IPv6 address.
	ErrInvalidTuple error = &invalidInput{"hash4: invalid tuple"}
	// ErrInvalidAddr is ErrInvalidTuple under the name that the socket
	// tables' methods and PortAllocator use.
	ErrInvalidAddr error = &invalidInput{"hash4: invalid address"}
	// ErrNilValue: the value to insert is nil.
	ErrNilValue = errors.New("hash4: nil value")
	// ErrTableFull: the table holds 2^31-1 entries, as many as it can index.
	ErrTableFull = errors.New("hash4: table full")
	// ErrTooLarge: a size asked of Table.Grow is beyond the most buckets
	// the table may have (see WithMaxBuckets).
	ErrTooLarge = errors.New("hash4: size beyond the table's bucket limit")
	// ErrNilAllocator: a nil *PortAllocator, or one that NewPortAllocator
	// did not make (its zero value), was given to Connect, ConnectFunc,
	// Bind or BindEphemeral; or Connect or ConnectFunc of a table made
	// WithPortAllocator(a) was given another allocator than a.
	ErrNilAllocator = errors.New("hash4: unusable PortAllocator")
	// ErrPortRefused is for the function of a ConnectFunc to return,
	// wrapped, when the flow cannot have the port it was offered (the
	// operating system refused to bind it): ConnectFunc then tries the
	// next port. The refusal lasts for that call only, as the allocator
	// knows nothing of other programs' sockets: to keep later calls off
	// the port, hold it with PortAllocator.Bind (see Table.ConnectFunc).
	ErrPortRefused = errors.New("hash4: port refused")
)

// invalidInput is the type of ErrInvalidTuple and ErrInvalidAddr, each of
// which matches the other under errors.Is.
type invalidInput struct{ msg string }

func (e *invalidInput) Error() string { return e.msg }

// Is reports whether target is ErrInvalidTuple or ErrInvalidAddr.
func (e *invalidInput) Is(target error) bool {
	return target == ErrInvalidTuple || target == ErrInvalidAddr
}

// The panics of the nil and zero values of the tables, on first use. N.B.
// callers panic with them where a hot path tests anyway (a nil array, an
// empty slice): the compiler sees the panic end the path and saves no
// register for it, as it would for a call.
const (
	nilTable     = "hash4: nil *Table: make one with New"
	nilUDPTable  = "hash4: nil *UDPTable: make one with NewUDPTable"
	nilTCPTable  = "hash4: nil *TCPTable: make one with NewTCPTable"
	zeroTable    = "hash4: Table used without New"
	zeroUDPTable = "hash4: UDPTable used without NewUDPTable"
	zeroTCPTable = "hash4: TCPTable used without NewTCPTable"
)

// ErrInvalidPortRange is returned, wrapped, for a port range whose Low is 0 or
// above its High.
var ErrInvalidPortRange = errors.New("hash4: invalid port range")

// ErrInvalidReservedPorts is returned, wrapped, for a reserved-port list that
// does not parse or names port 0 or a port above 65535.
var ErrInvalidReservedPorts = errors.New("hash4: invalid reserved ports")

// ErrNoPorts is returned when no local port is free: every port of the
// range is reserved, held, or in use. It matches syscall.EADDRNOTAVAIL under
// errors.Is, the error connect() returns in that case. (Linux's bind() to
// port 0 reports EADDRINUSE instead; BindEphemeral returns ErrNoPorts too.)
var ErrNoPorts error = errnoError{"hash4: no free local port (EADDRNOTAVAIL)", syscall.EADDRNOTAVAIL}

// ErrInvalidPolicy is returned, wrapped, by NewPortAllocator for a Policy
// other than OddEven and Flat.
var ErrInvalidPolicy = errors.New("hash4: invalid port policy")

// ErrPortInUse is returned, wrapped, for a local port already taken: by
// PortAllocator.Bind (see there), UDPTable.Bind and TCPTable.Listen. It
// matches syscall.EADDRINUSE under errors.Is.
var ErrPortInUse error = errnoError{"hash4: local port in use (EADDRINUSE)", syscall.EADDRINUSE}

// errnoError is a sentinel error that also matches one system error number.
type errnoError struct {
	msg   string
	errno syscall.Errno
}

func (e errnoError) Error() string { return e.msg }

// Is reports whether target is the error number e stands for.
func (e errnoError) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && t == e.errno
}
