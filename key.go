package hash4

import (
	"fmt"
	"net/netip"
)

// This file holds a flow as callers name it (Tuple) and as tables store and
// compare it (key): its hash and ports in one word, its addresses as the two
// words of their 16-byte form (words.go).

// Tuple is one flow seen from the local host: the local address and port, and
// the remote (peer) address and port. Its zero value is not a valid flow.
//
// As a table key, an IPv4 address and its IPv4-mapped IPv6 form are the same
// address, and zones are not part of the key (see Table).
type Tuple struct {
	Local, Remote netip.AddrPort
}

// String returns the tuple as "local->remote".
func (t Tuple) String() string {
	return t.Local.String() + "->" + t.Remote.String()
}

// key is a tuple in the form entries store: meta holds the full hash in its
// top 32 bits, the local port in bits 16-31 and the remote port in bits 0-15;
// addresses are the two words of their 16-byte form (IPv4 as IPv4-mapped,
// zone dropped).
type key struct {
	meta          uint64
	remote, local [2]uint64
}

// lportMask is the local port's field in a key's meta (see key.setPort).
const lportMask = 0xffff << 16

// hash returns k's full hash.
func (k *key) hash() uint32 { return uint32(k.meta >> 32) }

// port returns k's local port.
func (k *key) port() uint16 { return uint16(k.meta >> 16) }

// setPort sets the local port of k, given the hash of k with local port 0.
func (k *key) setPort(hash0 uint32, localPort, remotePort uint16) {
	k.meta = uint64(hash0+uint32(localPort))<<32 | uint64(localPort)<<16 | uint64(remotePort)
}

// tuple returns the Tuple of k, IPv4-mapped addresses in their IPv4 form.
func (k *key) tuple() Tuple {
	return Tuple{
		Local:  netip.AddrPortFrom(wordsAddr(k.local), k.port()),
		Remote: netip.AddrPortFrom(wordsAddr(k.remote), uint16(k.meta)),
	}
}

// entryKey is a key as an entry holds it: words readers load one at a time
// and writers replace only while the entry is free (store: release_*.go).
type entryKey struct {
	meta          relUint64
	remote, local [2]relUint64
}

// matches reports whether x holds k, hash word first; the caller checks seq
// around it. N.B. not generic, so that it inlines into the lookup loops.
func (x *entryKey) matches(k *key) bool {
	return x.meta.Load() == k.meta &&
		x.remote[1].Load() == k.remote[1] && x.remote[0].Load() == k.remote[0] &&
		x.local[1].Load() == k.local[1] && x.local[0].Load() == k.local[0]
}

// matchesHeld reports whether x holds k or k's reservation (see entry),
// ignoring meta's local port: with all else equal, equal hashes mean equal
// ports (hash = hash0 + port). Writers use it under the bucket lock.
func (x *entryKey) matchesHeld(k *key) bool {
	return (x.meta.Load()^k.meta)&^lportMask == 0 &&
		x.remote[1].Load() == k.remote[1] && x.remote[0].Load() == k.remote[0] &&
		x.local[1].Load() == k.local[1] && x.local[0].Load() == k.local[0]
}

// matchesLocal reports whether x holds k's hash, ports and local address,
// the parts of a listener's key that name it (see TCPTable): its remote
// words hold its listen word instead of an address. The caller checks the
// entry's seq around it.
func (x *entryKey) matchesLocal(k *key) bool {
	return x.meta.Load() == k.meta && x.local[1].Load() == k.local[1] && x.local[0].Load() == k.local[0]
}

// load returns the words of x, loaded one at a time: a consistent key only
// if x does not change meanwhile (the caller holds the lock that covers x,
// or checks the entry's seq around the load).
func (x *entryKey) load() key {
	return key{
		meta:   x.meta.Load(),
		remote: [2]uint64{x.remote[0].Load(), x.remote[1].Load()},
		local:  [2]uint64{x.local[0].Load(), x.local[1].Load()},
	}
}

// tupleKey sets *k to the key of *tup, and panics, named, for a nil table.
// N.B. it fills k in place from the addresses where they lie: a copy costs a
// tenth of a cached lookup.
func (t *Table[T]) tupleKey(k *key, tup *Tuple) {
	if t == nil {
		panic(nilTable)
	}
	if addrReprKnown { // setWords, in line
		setWordsReprAt(&k.remote, &tup.Remote)
		setWordsReprAt(&k.local, &tup.Local)
	} else {
		setWordsAs16(&k.remote, tup.Remote.Addr())
		setWordsAs16(&k.local, tup.Local.Addr())
	}
	rport := tup.Remote.Port()
	k.setPort(t.hashPort0(&k.local, &k.remote, rport), tup.Local.Port(), rport)
}

// hashPort0 hashes with the table's hasher and keys. N.B. one call to a
// function that is not generic, to fit tupleKey's inlining budget.
func (t *Table[T]) hashPort0(local, remote *[2]uint64, rport uint16) uint32 {
	return tableHash(t.hasher, &t.secret, &t.fold, local, remote, rport)
}

// setKey sets *k to the key of the flow (local:localPort, remote), hashed,
// as tupleKey does for a tuple.
func (t *Table[T]) setKey(k *key, local netip.Addr, localPort uint16, remote netip.AddrPort) {
	setWords(&k.remote, remote.Addr())
	setWords(&k.local, local)
	k.setPort(t.hashPort0(&k.local, &k.remote, remote.Port()), localPort, remote.Port())
}

// valid reports whether validate accepts k's tuple: ports not 0, addresses
// specified (the zero Addr's words are ::'s) and of one family. Writers
// check it, a few compares, and ask validate only why it failed.
func (k *key) valid() bool {
	return k.meta&0xffff != 0 && k.meta&lportMask != 0 &&
		specified(&k.local) && specified(&k.remote) && wordsAreIPv4(&k.local) == wordsAreIPv4(&k.remote)
}

// specified reports whether w, an address's words, are neither :: nor
// 0.0.0.0.
func specified(w *[2]uint64) bool { return w[0] != 0 || w[1] != 0 && w[1] != wordsAny4[1] }

// validate reports why tup cannot be a key, or nil.
func validate(tup Tuple) error {
	why := addrProblem(tup.Local.Addr(), tup.Remote.Addr())
	if why == "" && (tup.Local.Port() == 0 || tup.Remote.Port() == 0) {
		why = "port 0"
	}
	if why != "" {
		return fmt.Errorf("%w %v: %s", ErrInvalidTuple, tup, why)
	}
	return nil
}

// addrProblem says why local and remote cannot be the addresses of a key,
// or returns "". N.B. zones are dropped first, as keys drop them: netip's
// IsUnspecified says no for ::%eth0, whose key holds ::.
func addrProblem(local, remote netip.Addr) string {
	l, r := local.Unmap().WithZone(""), remote.Unmap().WithZone("")
	switch {
	case !l.IsValid() || !r.IsValid():
		return "invalid address"
	case l.IsUnspecified() || r.IsUnspecified():
		return "unspecified address"
	case l.Is4() != r.Is4():
		return "local and remote address families differ"
	}
	return ""
}

// validateInsert reports why tup with value v cannot be inserted, or nil.
func validateInsert[T any](tup Tuple, v *T) error {
	if err := validate(tup); err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w for %v", ErrNilValue, tup)
	}
	return nil
}
