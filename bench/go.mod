module github.com/hash4/hash4/bench

go 1.24

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/dchest/siphash v1.2.3
	github.com/hash4/hash4 v0.0.0
	github.com/orcaman/concurrent-map/v2 v2.0.1
	github.com/puzpuzpuz/xsync/v4 v4.5.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

replace github.com/hash4/hash4 => ../
