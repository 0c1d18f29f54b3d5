#include "etcd_curl.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

#include "error.hpp"
#include "exit_codes.hpp"
#include "sys.hpp"

namespace looplock::etcd {

namespace {

constexpr size_t kMaxResponse = 4 << 20;
// Without /proc: how many descriptors to look at for libcurl's sockets.
constexpr long kMaxFdScan = 65536;

// What the write callback collects.
struct Sink {
  std::string body;
  bool first_line_enough = false;
  bool line_seen = false;  // stopped on purpose after a stream's first line
  bool too_large = false;
};

size_t on_data(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t len = size * count;
  if (sink->body.size() + len > kMaxResponse) {
    sink->too_large = true;
    return 0;  // abort: CURLE_WRITE_ERROR
  }
  sink->body.append(data, len);
  if (sink->first_line_enough && sink->body.find('\n') != std::string::npos) {
    sink->line_seen = true;
    return 0;  // a whole line of a stream that would not end: enough
  }
  return len;
}

// Whether a signal's default action ends the process (not one that is
// ignored, stops or continues it by default).
bool ends_process(int sig) {
  switch (sig) {
    case SIGCHLD: case SIGCONT: case SIGURG: case SIGWINCH:
    case SIGSTOP: case SIGTSTP: case SIGTTIN: case SIGTTOU:
      return false;
    default:
      return true;
  }
}

// Called by libcurl about once a second at least while a request is in
// flight (every signal blocked, see post()): aborts the request when a signal
// is pending that the caller had not blocked and that would end looplock, so
// that it does as soon as post() restores the caller's mask.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* caller_mask = static_cast<const sigset_t*>(user);
  sigset_t pending;
  if (sigpending(&pending) != 0) return 0;
  for (int s = 1; s < NSIG; ++s) {
    if (sigismember(&pending, s) == 1 && sigismember(caller_mask, s) == 0 && ends_process(s)) return 1;
  }
  return 0;
}

curl_socket_t open_socket(void*, curlsocktype, curl_sockaddr* a) {
  const int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

bool is_socket(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

// The descriptors that are sockets: from /proc/self/fd, or without /proc by
// trying each number below the descriptor limit.
std::set<int> open_sockets() {
  std::set<int> out;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const int fd = std::atoi(e->d_name);
      if (fd != dirfd(d) && is_socket(fd)) out.insert(fd);
    }
    closedir(d);
    return out;
  }
  rlimit lim{};
  const long limit = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                         ? static_cast<long>(std::min<rlim_t>(lim.rlim_cur, kMaxFdScan))
                         : kMaxFdScan;
  for (int fd = 0; fd < limit; ++fd) {
    if (is_socket(fd)) out.insert(fd);
  }
  return out;
}

long ms_until(long long until_ns) {
  const long long left = until_ns - sys::monotonic_ns();
  return static_cast<long>(std::clamp<long long>((left + 999'999) / 1'000'000, 1, 86'400'000));
}

template <typename T>
void set(CURL* easy, CURLoption option, T value) {
  // Setting a known option with a valid value cannot fail but for lack of memory.
  if (curl_easy_setopt(easy, option, value) == CURLE_OUT_OF_MEMORY) throw std::bad_alloc();
}

}  // namespace

CurlTransport::CurlTransport() : sockets_before_(open_sockets()) {}

void CurlTransport::set_up() {
  if (curl_global_init(CURL_GLOBAL_NOTHING) != CURLE_OK) {
    throw Fatal(exit_code::kOsError, "cannot set up libcurl for the etcd client");
  }
  global_ = true;
  if (!(easy_ = curl_easy_init())) throw Fatal(exit_code::kOsError, "cannot set up libcurl for the etcd client");
  for (const char* h : {"Content-Type: application/json", "Expect:"}) {  // "Expect:": no 100-continue round trip
    curl_slist* more = curl_slist_append(headers_, h);
    if (!more) throw std::bad_alloc();
    headers_ = more;
  }
  set(easy_, CURLOPT_NOSIGNAL, 1L);
  set(easy_, CURLOPT_PROTOCOLS_STR, "http");
  set(easy_, CURLOPT_PROXY, "");  // never the environment's http_proxy
  set(easy_, CURLOPT_HTTPHEADER, headers_);
  set(easy_, CURLOPT_WRITEFUNCTION, on_data);
  set(easy_, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  set(easy_, CURLOPT_TCP_NODELAY, 1L);
  // A connection per request, like "Connection: close": a kept connection to
  // a host that died silently would turn the next request into a timeout
  // instead of a failed connect, and the next endpoint would not be tried.
  set(easy_, CURLOPT_FORBID_REUSE, 1L);
  // Do not wait for a name lookup that outlives its timeout (libcurl would
  // otherwise join the resolver thread before returning).
  set(easy_, CURLOPT_QUICK_EXIT, 1L);
  set(easy_, CURLOPT_NOPROGRESS, 0L);
  set(easy_, CURLOPT_XFERINFOFUNCTION, on_progress);
}

void CurlTransport::close_new_sockets_on_exec() const {
  for (int fd : open_sockets()) {
    if (sockets_before_.contains(fd)) continue;
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

CurlTransport::~CurlTransport() {
  if (easy_) curl_easy_cleanup(easy_);
  curl_slist_free_all(headers_);
  if (global_) curl_global_cleanup();
}

Exchange CurlTransport::post(const Endpoint& ep, std::string_view path, const std::string& body,
                             long long connect_deadline_ns, long long deadline_ns, bool first_line_enough,
                             HttpResponse& out, std::string& error) {
  if (!easy_) set_up();
  const std::string url = ep.text + std::string(path);
  Sink sink;
  sink.first_line_enough = first_line_enough;
  char message[CURL_ERROR_SIZE] = "";
  set(easy_, CURLOPT_URL, url.c_str());
  set(easy_, CURLOPT_POSTFIELDS, body.c_str());
  set(easy_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  set(easy_, CURLOPT_WRITEDATA, &sink);
  set(easy_, CURLOPT_ERRORBUFFER, message);
  set(easy_, CURLOPT_CONNECTTIMEOUT_MS, ms_until(std::min(connect_deadline_ns, deadline_ns)));
  set(easy_, CURLOPT_TIMEOUT_MS, ms_until(deadline_ns));

  // Every signal is blocked while libcurl works, so that a resolver thread it
  // starts (and may leave behind, CURLOPT_QUICK_EXIT) can never take a signal
  // meant for looplock; on_progress ends the request early for one that
  // would end looplock, and restoring the mask lets it take effect.
  sigset_t all, caller_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &caller_mask);
  set(easy_, CURLOPT_XFERINFODATA, &caller_mask);
  const CURLcode rc = curl_easy_perform(easy_);
  close_new_sockets_on_exec();
  set(easy_, CURLOPT_ERRORBUFFER, static_cast<char*>(nullptr));  // `message` ends here
  pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);

  long status = 0;
  curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &status);
  long sent = 0;  // bytes of request headers sent: 0 means no connection was made
  curl_easy_getinfo(easy_, CURLINFO_REQUEST_SIZE, &sent);
  const std::string why = ep.text + ": " + (message[0] ? message : curl_easy_strerror(rc));

  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && sink.line_seen)) {
    out.status = static_cast<int>(status);
    out.body = std::move(sink.body);
    return Exchange::Ok;
  }
  if (sink.too_large) {
    error = ep.text + ": answer too large";
    return Exchange::Broken;
  }
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
      error = why;
      return Exchange::ConnectFailed;
    case CURLE_OPERATION_TIMEDOUT:
      if (sent == 0) {
        error = ep.text + ": connection timed out";
        return Exchange::ConnectFailed;
      }
      error = ep.text + ": no answer before the deadline";
      return Exchange::TimedOut;
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
      if (sent == 0 || (status == 0 && sink.body.empty())) {
        error = ep.text + ": closed the connection without an answer";
        return Exchange::ConnectFailed;
      }
      error = why;
      return Exchange::Broken;
    case CURLE_ABORTED_BY_CALLBACK:
      error = ep.text + ": interrupted by a signal";
      return Exchange::Broken;
    default:
      error = why;
      return Exchange::Broken;
  }
}

}  // namespace looplock::etcd
