module github.com/hash4/hash4

go 1.26.0

require (
	github.com/orcaman/concurrent-map/v2 v2.0.1
	github.com/schollz/progressbar/v3 v3.19.1
	github.com/stretchr/testify v1.12.1
	github.com/zeebo/xxh3 v1.1.0
	golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da
)

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	golang.org/x/term v0.44.0 // indirect
)

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/dchest/siphash v1.2.3
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/puzpuzpuz/xsync/v4 v4.5.0
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
