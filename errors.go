package hash4

import (
	"errors"
	"fmt"
)

// Errors for bad input and for a table's state. Match them with errors.Is:
// the errors returned wrap them with the offending tuple or address, except
// ErrTableFull, which is returned as it is.
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
	// where a concrete one is needed, a port is 0, or two addresses that
	// must be of one family are not (see the rule above).
	ErrInvalidTuple error = &invalidInput{"hash4: invalid tuple"}
	// ErrInvalidAddr is ErrInvalidTuple under the name that the socket
	// tables' methods and PortAllocator use.
	ErrInvalidAddr error = &invalidInput{"hash4: invalid address"}
	// ErrNilValue: the value to insert is nil.
	ErrNilValue = errors.New("hash4: nil value")
	// ErrTableFull: the table holds 2^31-1 entries, as many as it can index.
	ErrTableFull = errors.New("hash4: table full")
	// ErrNilAllocator: a nil *PortAllocator, or one that NewPortAllocator
	// did not make (its zero value), was given to Connect, ConnectFunc,
	// Bind or BindEphemeral.
	ErrNilAllocator = errors.New("hash4: PortAllocator not made by NewPortAllocator")
	// ErrPortRefused is for the function of a ConnectFunc to return,
	// wrapped, when the flow cannot have the port it was offered (the
	// operating system refused to bind it): ConnectFunc then tries the
	// next port.
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

// unmade panics for a method called on the zero value of a type that must
// be made by its constructor. N.B. callers reach it from a test the hot
// paths make anyway (a nil array, an empty slice), in a branch of its own.
//
//go:noinline
func unmade(typ, ctor string) {
	panic(fmt.Sprintf("hash4: %s used without %s", typ, ctor))
}
