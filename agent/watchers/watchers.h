#ifndef RBD_OWNER_WATCHERS_H
#define RBD_OWNER_WATCHERS_H
#include <stddef.h>
#include <rados/librados.h>
#ifdef __cplusplus
extern "C" {
#endif
// rbd_owner_list_watchers lists the watchers of object oid: *addrs (malloc'd, the caller
// frees it) holds *len bytes, each watcher's address NUL-terminated. Returns 0 or -errno.
int rbd_owner_list_watchers(rados_ioctx_t io, const char *oid, char **addrs, size_t *len);
#ifdef __cplusplus
}
#endif
#endif
