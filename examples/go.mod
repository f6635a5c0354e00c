module github.com/hash4/hash4/examples

go 1.26.0

require (
	github.com/hash4/hash4 v0.0.0
	github.com/schollz/progressbar/v3 v3.19.1
	golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da
	golang.org/x/sys v0.48.0
)

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	golang.org/x/term v0.46.0 // indirect
)

replace github.com/hash4/hash4 => ../
