// Package version holds the build's version, stamped by the Makefile from git.
package version

// Version is set at link time (-X); a plain `go build` reports "dev".
var Version = "dev"
