// Package benchkit is the benchmark harness that the root package's tests
// and the module in bench/ share: the key sets every map is given, the walks
// benchmarks make over them, the adapter interface over the maps compared
// (with sync.Map's adapter) and the lookup, mixed and churn loops run on it,
// and the state of the Connect benchmarks (their flows, PRNG and
// connect-and-delete op).
//
// It does not import hash4. The root package's benchmarks are in-package
// tests (package hash4), as some reach unexported code (Connect's
// strategies), and a package they import cannot import hash4 without an
// import cycle. So benchkit works in plain values: keys are of any type
// whose underlying type is hash4.Tuple's (the constraint Tuple), made and
// passed through type parameters, and the Connect state sees its
// implementations through local ports only (Conn). What must name hash4's
// types, the adapters over *hash4.Table in particular, stays with each
// caller, where it is a direct call rather than one through a type
// parameter, which would add an indirect call to the timed path.
//
// It is a package of the root module that only tests import: the library
// does not import it, and it needs nothing beyond the standard library.
package benchkit
