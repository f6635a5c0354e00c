module github.com/hash4/hash4

go 1.23

require (
	github.com/dchest/siphash v1.2.3
	github.com/stretchr/testify v1.12.1
	github.com/zeebo/xxh3 v1.1.0
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
