// Package nat is a network address translator's state and packet
// rewriting, on hash4's tables, for a gateway that calls it once per packet
// in each direction.
package nat
