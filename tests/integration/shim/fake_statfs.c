/* LD_PRELOAD shim for the integration tests: makes fstatfs(2) report NFS.
 *
 * There is no NFS server on the test machines, so test_faults.py checks
 * looplock's "network file system" warning by preloading this module: with
 * FAKE_FSTYPE_NFS=1 in the environment, fstatfs() and fstatfs64() call the
 * real function (found with dlsym(RTLD_NEXT)) and then set f_type to
 * NFS_SUPER_MAGIC (0x6969). Without the variable they change nothing.
 *
 * It only reaches a dynamically linked looplock: a static one makes the
 * system call itself (the test then falls back to strace's poke_exit).
 */
/* Meson builds with _FILE_OFFSET_BITS=64, which renames fstatfs to
 * fstatfs64 in the headers; this file defines both names itself. */
#undef _FILE_OFFSET_BITS
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>

#define FAKE_NFS_SUPER_MAGIC 0x6969

static int fake_nfs(void) {
  const char *v = getenv("FAKE_FSTYPE_NFS");
  return v != NULL && strcmp(v, "1") == 0;
}

int fstatfs(int fd, struct statfs *buf) {
  static int (*real)(int, struct statfs *);
  if (real == NULL) {
    void *sym = dlsym(RTLD_NEXT, "fstatfs");
    memcpy(&real, &sym, sizeof real); /* POSIX: a data pointer to a function pointer */
  }
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  int r = real(fd, buf);
  if (r == 0 && fake_nfs()) buf->f_type = FAKE_NFS_SUPER_MAGIC;
  return r;
}

int fstatfs64(int fd, struct statfs64 *buf) {
  static int (*real)(int, struct statfs64 *);
  if (real == NULL) {
    void *sym = dlsym(RTLD_NEXT, "fstatfs64");
    memcpy(&real, &sym, sizeof real);
  }
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  int r = real(fd, buf);
  if (r == 0 && fake_nfs()) buf->f_type = FAKE_NFS_SUPER_MAGIC;
  return r;
}
