/* LD_PRELOAD shim for the integration tests: a name server that hangs.
 *
 * getaddrinfo() for a name ending in ".slow.test" sleeps SLOW_GETADDRINFO_MS
 * (default 5000) and then fails with EAI_NONAME; other names go to the real
 * function (dlsym(RTLD_NEXT)). test_etcd.py preloads it into looplock-etcd
 * (dynamically linked) to show that a hanging name lookup does not hold
 * looplock past its deadline.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int is_slow(const char *node) {
  static const char suffix[] = ".slow.test";
  size_t n = node ? strlen(node) : 0;
  return n >= sizeof suffix - 1 && strcmp(node + n - (sizeof suffix - 1), suffix) == 0;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
  if (is_slow(node)) {
    const char *ms_text = getenv("SLOW_GETADDRINFO_MS");
    long ms = ms_text ? atol(ms_text) : 5000;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
    return EAI_NONAME;
  }
  int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
  void *sym = dlsym(RTLD_NEXT, "getaddrinfo");
  memcpy(&real, &sym, sizeof real); /* POSIX: a data pointer to a function pointer */
  if (real == NULL) return EAI_SYSTEM;
  return real(node, service, hints, res);
}
