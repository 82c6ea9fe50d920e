// Package scenario is the lab's end-to-end scenarios as Go tests (build tag lab): the story of
// `make e2e` and `make e2e-prod`, told to two qemu guests and a Ceph cluster that tests/lab/lib.sh
// brought up. The shell keeps the plumbing (images, the network namespace, qemu, Ceph); this
// package drives the guests through one primitive, Lab.On (a command on a node, with a deadline,
// returning its output and exit status), and reads claims, heartbeats and audit entries with the
// agent's own types.
//
// The scenarios and the lab's primitives are behind the build tag lab (they need a running lab:
// tests/lab/e2e builds and runs them); the checkers that read only files (cephFlaps) are not, so
// that make unit tests them.
package scenario
