//go:build gendocs

package main

// With -tags gendocs (`make package` builds bin/rbd-owner-gendocs so, never shipped), the
// program has the hidden `__gendocs DIR`, which writes the manual pages (manual.go).
func init() {
	extraCommands = append(extraCommands, genDocsCommand)
}
