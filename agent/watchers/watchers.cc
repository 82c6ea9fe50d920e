// The one librados call the C API lacks: the watchers of an object (IoCtx::list_watchers,
// what `rados listwatchers` and librbd's list_watchers use). C++ through a C entry point.
#include <rados/librados.hpp>

#include <cstdlib>
#include <cstring>
#include <list>

#include "watchers.h"

extern "C" int rbd_owner_list_watchers(rados_ioctx_t io, const char *oid, char **addrs, size_t *len) {
  *addrs = nullptr;
  *len = 0;
  librados::IoCtx ctx;
  librados::IoCtx::from_rados_ioctx_t(io, ctx);
  std::list<obj_watch_t> ws;
  int r = ctx.list_watchers(oid, &ws);
  if (r < 0) {
    return r;
  }
  // the addresses, each NUL-terminated, back to back
  size_t n = 0;
  for (const auto &w : ws) {
    n += strnlen(w.addr, sizeof(w.addr)) + 1;
  }
  if (n == 0) {
    return 0;
  }
  char *out = static_cast<char *>(malloc(n));
  if (out == nullptr) {
    return -12;  // ENOMEM
  }
  char *p = out;
  for (const auto &w : ws) {
    size_t l = strnlen(w.addr, sizeof(w.addr));
    memcpy(p, w.addr, l);
    p[l] = '\0';
    p += l + 1;
  }
  *addrs = out;
  *len = n;
  return 0;
}
