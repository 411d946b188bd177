// Counts the flushes every library in the process makes. The executable defines fsync,
// fdatasync, msync, open and pwrite; the dynamic linker binds LMDB's and SQLite's calls to these
// (an executable's definition comes first), and each forwards to the C library's own. A write to
// a file opened with O_DSYNC or O_SYNC is a flush too: LMDB writes its meta page so.
#define _GNU_SOURCE
#include "CFerryFlushCount.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>

static atomic_long flushes;
enum { trackedFiles = 65536 };
/// Whether each descriptor was opened (last, through open) with O_DSYNC.
static atomic_bool synchronous[trackedFiles];

long ferry_flush_count(void) { return atomic_load(&flushes); }

#if defined(__linux__)
int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  atomic_fetch_add(&flushes, 1);
  return real ? real(fd) : -1;
}

int fdatasync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  atomic_fetch_add(&flushes, 1);
  return real ? real(fd) : -1;
}

int msync(void *address, size_t length, int flags) {
  static int (*real)(void *, size_t, int);
  if (!real) real = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
  if (flags & MS_SYNC) atomic_fetch_add(&flushes, 1);
  return real ? real(address, length, flags) : -1;
}

int open(const char *path, int flags, ...) {
  static int (*real)(const char *, int, ...);
  if (!real) real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list arguments;
    va_start(arguments, flags);
    mode = (mode_t)va_arg(arguments, int);
    va_end(arguments);
  }
  int fd = real ? real(path, flags, mode) : -1;
  if (fd >= 0 && fd < trackedFiles) atomic_store(&synchronous[fd], (flags & O_DSYNC) != 0);
  return fd;
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
  static ssize_t (*real)(int, const void *, size_t, off_t);
  if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (fd >= 0 && fd < trackedFiles && atomic_load(&synchronous[fd])) atomic_fetch_add(&flushes, 1);
  return real ? real(fd, buffer, count, offset) : -1;
}
#endif
