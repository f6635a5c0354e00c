package hash4

import (
	"fmt"
	"strconv"
	"strings"
)

// This file holds port ranges and reserved ports: their types, checks and
// the parsing of the kernel's sysctl text forms.

// PortRange is an inclusive range of local ports, [Low, High], like the
// kernel's ip_local_port_range.
type PortRange struct {
	Low, High uint16
}

// DefaultPortRange is the kernel's default ip_local_port_range, 32768-60999.
var DefaultPortRange = PortRange{32768, 60999}

// Validate returns nil if r is a usable port range, and otherwise an error
// wrapping ErrInvalidPortRange: Low must be at least 1 and at most High.
func (r PortRange) Validate() error {
	switch {
	case r.Low == 0:
		return fmt.Errorf("%w %s: port 0 is not a local port", ErrInvalidPortRange, r.text())
	case r.Low > r.High:
		return fmt.Errorf("%w %s: low above high", ErrInvalidPortRange, r.text())
	}
	return nil
}

// Size returns the number of ports in r, or 0 if r is invalid.
func (r PortRange) Size() int {
	if r.Validate() != nil {
		return 0
	}
	return int(r.High) - int(r.Low) + 1
}

// ParsePortRange parses a port range as "low-high", as the sysctl
// ip_local_port_range shows it ("low high", the two ports separated by
// spaces or a tab), or as a single port. Spaces around the ports are
// ignored. Anything else gives an error that wraps ErrInvalidPortRange and
// quotes s; a range that Validate rejects, Validate's error.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		if f := strings.Fields(s); len(f) == 2 {
			lo, hi = f[0], f[1]
		} else {
			hi = lo
		}
	}
	l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	h, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil {
		return PortRange{}, fmt.Errorf("%w %q: want low-high, such as 32768-60999, with ports in 1-65535", ErrInvalidPortRange, s)
	}
	r := PortRange{Low: uint16(l), High: uint16(h)}
	if err := r.Validate(); err != nil {
		return PortRange{}, err
	}
	return r, nil
}

// text returns r as "low-high".
func (r PortRange) text() string {
	return strconv.Itoa(int(r.Low)) + "-" + strconv.Itoa(int(r.High))
}

// ParseReservedPorts parses a reserved-port list in the form of the sysctl
// ip_local_reserved_ports: comma-separated ports and inclusive ranges
// "low-high", such as "8080,9000-9010". Spaces around ports, dashes and commas
// are ignored, and a string of spaces or the empty string is the empty list.
// The ports are returned in increasing order without duplicates. An error
// wraps ErrInvalidReservedPorts and quotes the offending item.
func ParseReservedPorts(s string) ([]uint16, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var set [65536 / 64]uint64
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("%w: empty item in %q", ErrInvalidReservedPorts, s)
		}
		lo, hi, isRange := strings.Cut(item, "-")
		first, err := parseReservedPort(lo, item)
		if err != nil {
			return nil, err
		}
		last := first
		if isRange {
			if last, err = parseReservedPort(hi, item); err != nil {
				return nil, err
			}
			if first > last {
				return nil, fmt.Errorf("%w: %q: range runs backwards", ErrInvalidReservedPorts, item)
			}
		}
		for p := first; p <= last; p++ {
			set[p/64] |= 1 << (p % 64)
		}
	}
	var ports []uint16
	for p := range 65536 {
		if set[p/64]&(1<<(p%64)) != 0 {
			ports = append(ports, uint16(p))
		}
	}
	return ports, nil
}

// parseReservedPort parses one port of item, a decimal number in [1, 65535].
func parseReservedPort(s, item string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%w: %q: not a port or port range", ErrInvalidReservedPorts, item)
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 || n > 65535 {
		return 0, fmt.Errorf("%w: %q: port outside 1-65535", ErrInvalidReservedPorts, item)
	}
	return int(n), nil
}
