package cephconn

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

// ceph_release is what Ceph's `const char *ceph_version_to_str()` says (its release, as in
// "16.2.15"), found among the libraries loaded: libceph-common.so.2, which librados loads from
// a directory of its own (so that nothing links it by name), exports it as a C++ function.
// NULL when it is not there.
static const char *ceph_release(void) {
	const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "_Z19ceph_version_to_strv");
	return f ? f() : NULL;
}
*/
import "C"

import "strings"

// LibradosRelease is the Ceph release of the librados this process loads, as Ceph says it
// ("16.2.15"; a development build adds "-N-gHASH"): which key types it reads
// (krbd.LibradosReadsKey). "" when the library does not say.
func LibradosRelease() string {
	s := C.ceph_release()
	if s == nil {
		return ""
	}
	return strings.TrimSpace(C.GoString(s))
}
