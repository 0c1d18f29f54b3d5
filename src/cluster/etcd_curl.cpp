#include "cluster/etcd_curl.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "os/posix/interrupts.hpp"
#include "os/sys.hpp"

namespace looplock::etcd {

namespace {

constexpr size_t kMaxResponse = 4 << 20;
// How long the questions about a failed transfer (probe()) may take at most.
constexpr Duration kProbeTime = std::chrono::milliseconds(250);
// Without /proc: how many descriptors to look at for libcurl's sockets.
constexpr long kMaxFdScan = 65536;

// What the write callback collects.
struct Sink {
  std::string body;
  const std::function<bool(std::string_view)>* enough = nullptr;  // a stream's end, as the caller sees it
  bool stopped = false;                                           // stopped on purpose: the stream said enough
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
  if (sink->enough && *sink->enough && (*sink->enough)(sink->body)) {
    sink->stopped = true;
    return 0;  // a stream that would not end has said enough
  }
  return len;
}

// Whether a signal's default action ends the process (not one that is
// ignored, stops or continues it by default).
bool ends_process(int sig) {
  switch (sig) {
    case SIGCHLD:
    case SIGCONT:
    case SIGURG:
    case SIGWINCH:
    case SIGSTOP:
    case SIGTSTP:
    case SIGTTIN:
    case SIGTTOU: return false;
    default: return true;
  }
}

// What on_progress looks at: the caller's signal mask, the signals that end
// the request whatever the mask (Request::interrupt_on), and whether one did.
struct SignalWatch {
  sigset_t caller_mask;
  const sigset_t* interrupt_on = nullptr;
  bool interrupted = false;
};

// Called by libcurl about once a second at least while a request is in
// flight (every signal blocked, see post()): aborts the request when a signal
// is pending that the caller had not blocked and that would end looplock, so
// that it does as soon as post() restores the caller's mask; or one of
// `interrupt_on`, which the caller takes itself once post() has returned.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* watch = static_cast<SignalWatch*>(user);
  sigset_t pending;
  if (sigpending(&pending) != 0) return 0;
  for (int s = 1; s < NSIG; ++s) {
    if (sigismember(&pending, s) != 1) continue;
    if (watch->interrupt_on && sigismember(watch->interrupt_on, s) == 1) {
      watch->interrupted = true;
      return 1;
    }
    if (sigismember(&watch->caller_mask, s) == 0 && ends_process(s)) return 1;
  }
  return 0;
}

curl_socket_t open_socket(void*, curlsocktype, curl_sockaddr* a) {
  const int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

// What connect_socket() saw, for post() to tell refused from timed out.
struct ConnectState {
  Instant deadline{};
  bool timed_out = false;
  int error = 0;
};

// The TCP connection, made here so that the connect timeout bounds it alone:
// libcurl's own connect timeout would bound the TLS handshake too, which a
// busy host may need longer for (it gets the attempt's time instead).
curl_socket_t connect_socket(void* user, curlsocktype, curl_sockaddr* a) {
  auto* st = static_cast<ConnectState*>(user);
  const int fd = socket(a->family, a->socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->protocol);
  if (fd < 0) {
    st->error = errno;
    return CURL_SOCKET_BAD;
  }
  if (connect(fd, &a->addr, a->addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    st->error = errno;
    close(fd);
    return CURL_SOCKET_BAD;
  }
  for (;;) {
    const Duration left = st->deadline - MonotonicClock::now();
    if (left <= Duration::zero()) {
      st->timed_out = true;
      close(fd);
      return CURL_SOCKET_BAD;
    }
    pollfd p{fd, POLLOUT, 0};
    const int n =
        poll(&p, 1,
             static_cast<int>(std::min<long long>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 60'000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // the deadline is looked at again above
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) return fd;
    st->error = err;
    close(fd);
    return CURL_SOCKET_BAD;
  }
}

int already_connected(void*, curl_socket_t, curlsocktype) { return CURL_SOCKOPT_ALREADY_CONNECTED; }

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

// Milliseconds until `until` (rounded up), as libcurl's timeouts count them:
// at least 1 (0 would mean none), at most a day.
long ms_until(Instant until) {
  const long long left = std::chrono::ceil<std::chrono::milliseconds>(until - MonotonicClock::now()).count();
  return static_cast<long>(std::clamp<long long>(left, 1, 86'400'000));
}

template <typename T>
void set(CURL* easy, CURLoption option, T value) {
  // Setting a known option with a valid value cannot fail but for lack of memory.
  if (curl_easy_setopt(easy, option, value) == CURLE_OUT_OF_MEMORY) throw std::bad_alloc();
}

// libcurl's codes for a TLS handshake that failed or a certificate that was
// refused (either side's).
bool tls_failure(CURLcode rc) {
  switch (rc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_USE_SSL_FAILED: return true;
    default: return false;
  }
}

// The first bytes of an answer (a probe's).
size_t keep_some(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  body->append(data, std::min(size * count, size_t{4096} - std::min(body->size(), size_t{4096})));
  return size * count;
}

}  // namespace

TlsFailure classify_tls_failure(CURLcode code, std::string_view message) {
  auto says = [&](std::initializer_list<std::string_view> words) {
    return std::any_of(words.begin(), words.end(),
                       [&](std::string_view w) { return message.find(w) != std::string_view::npos; });
  };
  if (says({"alert"})) return TlsFailure::Alert;
  const bool closed_early = code == CURLE_RECV_ERROR || code == CURLE_SEND_ERROR || code == CURLE_GOT_NOTHING;
  if (code != CURLE_SSL_CONNECT_ERROR && !closed_early) return TlsFailure::Other;
  if (says({"wrong version number", "packet length too long"})) return TlsFailure::NotTls;
  // Closed or reset in the middle of the handshake, without a word of TLS.
  if (closed_early || says({"SSL_ERROR_SYSCALL", "unexpected eof", "Connection reset", "Recv failure", "Send failure",
                            "Broken pipe"})) {
    return TlsFailure::NoTlsAnswer;
  }
  return TlsFailure::Other;
}

CurlTransport::CurlTransport() : sockets_before_(open_sockets()) {}

void CurlTransport::configure(const Security& security) {
  security_ = security;
  if (easy_) apply_security();
}

void CurlTransport::apply_security() {
  // Empty: libcurl's defaults (the system's CA bundle, no client certificate).
  set(easy_, CURLOPT_CAINFO, security_.cacert.empty() ? nullptr : security_.cacert.c_str());
  set(easy_, CURLOPT_SSLCERT, security_.cert.empty() ? nullptr : security_.cert.c_str());
  set(easy_, CURLOPT_SSLKEY, security_.key.empty() ? nullptr : security_.key.c_str());
}

void CurlTransport::set_up() {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
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
  set(easy_, CURLOPT_PROTOCOLS_STR, "http,https");
  set(easy_, CURLOPT_PROXY, "");  // never the environment's http_proxy
  set(easy_, CURLOPT_WRITEFUNCTION, on_data);
  set(easy_, CURLOPT_OPENSOCKETFUNCTION, connect_socket);
  set(easy_, CURLOPT_SOCKOPTFUNCTION, already_connected);
  set(easy_, CURLOPT_TCP_NODELAY, 1L);
  // One kept connection per endpoint for the whole run (a TLS handshake
  // once, not per request). A kept connection to a member that died is
  // noticed by libcurl (closed) or by the short attempt timeout (silent), and
  // the Client then asks for a fresh one (Request::fresh_connection).
  set(easy_, CURLOPT_MAXCONNECTS, 16L);
  // Do not wait for a name lookup that outlives its timeout (libcurl would
  // otherwise join the resolver thread before returning).
  set(easy_, CURLOPT_QUICK_EXIT, 1L);
  set(easy_, CURLOPT_NOPROGRESS, 0L);
  set(easy_, CURLOPT_XFERINFOFUNCTION, on_progress);
  apply_security();
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

bool CurlTransport::speaks_tls(const Endpoint& ep, Instant deadline) const {
  CURL* probe = curl_easy_init();
  if (!probe) return false;
  const std::string url = "https://" + ep.text.substr(ep.text.find("://") + 3) + "/";
  char message[CURL_ERROR_SIZE] = "";
  set(probe, CURLOPT_URL, url.c_str());
  set(probe, CURLOPT_CONNECT_ONLY, 1L);
  set(probe, CURLOPT_SSL_VERIFYPEER, 0L);  // only asks whether TLS is spoken; nothing is sent
  set(probe, CURLOPT_SSL_VERIFYHOST, 0L);
  set(probe, CURLOPT_NOSIGNAL, 1L);
  set(probe, CURLOPT_PROXY, "");
  set(probe, CURLOPT_QUICK_EXIT, 1L);
  set(probe, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  set(probe, CURLOPT_ERRORBUFFER, message);
  set(probe, CURLOPT_CONNECTTIMEOUT_MS, ms_until(deadline));
  set(probe, CURLOPT_TIMEOUT_MS, ms_until(deadline));
  const CURLcode rc = curl_easy_perform(probe);
  curl_easy_cleanup(probe);
  // A completed handshake, or a TLS alert from the server (it wants a
  // client certificate): either way the port speaks TLS.
  return rc == CURLE_OK || (tls_failure(rc) && std::string_view(message).find("alert") != std::string_view::npos);
}

bool CurlTransport::speaks_plain_http(const Endpoint& ep, Instant deadline) {
  if (plain_http_.contains(ep.text)) return true;
  if (not_plain_http_.contains(ep.text)) return false;
  CURL* probe = curl_easy_init();
  if (!probe) return false;
  // etcd answers GET /version; any HTTP answer says the port speaks plain
  // HTTP, but for a TLS server's to a plain request (Go's "Client sent an
  // HTTP request to an HTTPS server.").
  const std::string url = "http://" + ep.text.substr(ep.text.find("://") + 3) + "/version";
  std::string body;
  set(probe, CURLOPT_URL, url.c_str());
  set(probe, CURLOPT_NOSIGNAL, 1L);
  set(probe, CURLOPT_PROXY, "");
  set(probe, CURLOPT_QUICK_EXIT, 1L);
  set(probe, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  set(probe, CURLOPT_WRITEFUNCTION, keep_some);
  set(probe, CURLOPT_WRITEDATA, &body);
  set(probe, CURLOPT_CONNECTTIMEOUT_MS, ms_until(deadline));
  set(probe, CURLOPT_TIMEOUT_MS, ms_until(deadline));
  (void)curl_easy_perform(probe);
  long status = 0;
  curl_easy_getinfo(probe, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(probe);
  const bool plain = status > 0 && body.find("HTTPS server") == std::string::npos;
  (plain ? plain_http_ : not_plain_http_).insert(ep.text);
  return plain;
}

Transfer CurlTransport::perform(const Endpoint& ep, const Request& req) {
  if (!easy_) set_up();
  const std::string url = ep.text + std::string(req.path);
  const std::string body(req.body);
  Sink sink;
  sink.enough = &req.enough;
  char message[CURL_ERROR_SIZE] = "";
  curl_slist* headers = headers_;
  curl_slist* with_token = nullptr;
  std::vector<std::string> more;
  // etcd reads its auth token from the Authorization header (as is, no scheme).
  if (!req.token.empty()) more.push_back("Authorization: " + std::string(req.token));
  // The gateway's deadline for the call, in milliseconds ("1500m"): it ends
  // a stream's answer then (etcd.hpp, Request::server_timeout).
  if (req.server_timeout) {
    more.push_back("Grpc-Timeout: " + std::to_string(ms_of(*req.server_timeout)) + "m");
  }
  if (!more.empty()) {
    std::vector<std::string> all;
    for (curl_slist* h = headers_; h; h = h->next) all.emplace_back(h->data);
    all.insert(all.end(), more.begin(), more.end());
    for (const auto& h : all) {
      curl_slist* longer = curl_slist_append(with_token, h.c_str());
      if (!longer) {
        curl_slist_free_all(with_token);
        throw std::bad_alloc();
      }
      with_token = longer;
    }
    headers = with_token;
  }
  set(easy_, CURLOPT_URL, url.c_str());
  set(easy_, CURLOPT_HTTPHEADER, headers);
  set(easy_, CURLOPT_POSTFIELDS, body.c_str());
  set(easy_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  set(easy_, CURLOPT_WRITEDATA, &sink);
  set(easy_, CURLOPT_ERRORBUFFER, message);
  // The name lookup, the TCP connection (connect_socket, by
  // connect_deadline) and the TLS handshake must end by the deadline.
  ConnectState connecting;
  connecting.deadline = std::min(req.connect_deadline, req.deadline);
  set(easy_, CURLOPT_OPENSOCKETDATA, &connecting);
  set(easy_, CURLOPT_CONNECTTIMEOUT_MS, ms_until(req.deadline));
  set(easy_, CURLOPT_TIMEOUT_MS, ms_until(req.deadline));
  set(easy_, CURLOPT_FRESH_CONNECT, req.fresh_connection ? 1L : 0L);

  // Every signal is blocked while libcurl works, so that a resolver thread it
  // starts (and may leave behind, CURLOPT_QUICK_EXIT) can never take a signal
  // meant for looplock; on_progress ends the request early for one that
  // would end looplock, and restoring the mask lets it take effect.
  sigset_t all;
  sigfillset(&all);
  SignalWatch watch;
  watch.interrupt_on = req.interrupt_on ? &req.interrupt_on->signals : nullptr;
  pthread_sigmask(SIG_BLOCK, &all, &watch.caller_mask);
  set(easy_, CURLOPT_XFERINFODATA, &watch);
  Transfer t;
  t.rc = curl_easy_perform(easy_);
  set(easy_, CURLOPT_ERRORBUFFER, static_cast<char*>(nullptr));  // `message` ends here
  set(easy_, CURLOPT_HTTPHEADER, headers_);
  curl_slist_free_all(with_token);
  curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &t.status);
  curl_easy_getinfo(easy_, CURLINFO_REQUEST_SIZE, &t.sent);
  t.message = message;
  t.body = std::move(sink.body);
  t.too_large = sink.too_large;
  t.stopped = sink.stopped;
  t.connect_timed_out = connecting.timed_out;
  t.connect_error = connecting.error;
  t.interrupted = watch.interrupted;
  probe(ep, req, t);
  // libcurl's own sockets (its wake-up socketpair, made with the first
  // transfer) appear only with a transfer that set up something new: the
  // first, one that made a connection, or one whose probes ran (a look at
  // /proc/self/fd costs a dozen system calls; the uncontended run makes
  // three requests on one connection and looks once).
  long connects = 0;
  curl_easy_getinfo(easy_, CURLINFO_NUM_CONNECTS, &connects);
  if (!looked_ || connects > 0 || t.speaks_tls || t.speaks_plain_http || t.rc != CURLE_OK) {
    close_new_sockets_on_exec();
    looked_ = true;
  }
  pthread_sigmask(SIG_SETMASK, &watch.caller_mask, nullptr);
  return t;
}

// The questions a failed transfer may need answered, asked only then.
void CurlTransport::probe(const Endpoint& ep, const Request& req, Transfer& t) {
  const Instant by = std::min(req.deadline, MonotonicClock::now() + kProbeTime);
  const bool nothing_back = t.status == 0 && t.body.empty();
  const bool closed_early = t.rc == CURLE_RECV_ERROR || t.rc == CURLE_SEND_ERROR || t.rc == CURLE_GOT_NOTHING;
  // A plain-HTTP request to a TLS port: the server closes without a word.
  // Only then is it asked (one handshake, never a request) whether it speaks TLS.
  if (!ep.tls && nothing_back && closed_early) t.speaks_tls = speaks_tls(ep, by);
  // A TLS handshake with a plain-HTTP port: what comes back is not TLS, or
  // nothing (etcd closes the connection). Only then is it asked (one plain
  // GET /version, once per endpoint) whether it speaks HTTP. An endpoint
  // found to speak plain HTTP fails every handshake the same way.
  if (ep.tls && (tls_failure(t.rc) || (nothing_back && closed_early))) {
    const TlsFailure how = classify_tls_failure(t.rc, t.message);
    t.speaks_plain_http = plain_http_.contains(ep.text) ||
                          ((how == TlsFailure::NotTls || how == TlsFailure::NoTlsAnswer) && speaks_plain_http(ep, by));
  }
}

Classified classify_transfer(const Endpoint& ep, const Transfer& t) {
  const std::string said = t.message.empty() ? curl_easy_strerror(t.rc) : t.message;
  const std::string why = ep.text + ": " + said;
  const bool nothing_back = t.status == 0 && t.body.empty();
  const bool closed_early = t.rc == CURLE_RECV_ERROR || t.rc == CURLE_SEND_ERROR || t.rc == CURLE_GOT_NOTHING;
  if (t.rc == CURLE_OK || (t.rc == CURLE_WRITE_ERROR && t.stopped)) {
    const bool https_answer = !ep.tls && t.status == 400 && t.body.find("HTTPS server") != std::string::npos;
    return {Exchange::Ok, "", https_answer ? Cause::SpeaksTls : Cause::None};
  }
  if (t.too_large) return {Exchange::Broken, ep.text + ": answer too large", Cause::None};
  if (t.speaks_tls) {
    return {Exchange::ConnectFailed, ep.text + ": closed the connection without an answer: the endpoint speaks TLS",
            Cause::SpeaksTls};
  }
  if (t.speaks_plain_http) {
    return {Exchange::TlsFailed, ep.text + ": TLS: " + said + ": the endpoint speaks plain HTTP, not TLS",
            Cause::SpeaksPlainHttp};
  }
  // TLS 1.3: a server that refuses the client's certificate says so (an
  // alert) or just closes, after the client saw the handshake complete.
  const bool tls_alert = ep.tls && nothing_back && closed_early;
  if (tls_failure(t.rc) || tls_alert) {
    // Certificates and handshakes: the same for every member, usually, but
    // the next endpoint is tried all the same.
    const bool alert_said = t.message.find("alert") != std::string::npos;
    const std::string error =
        ep.text + ": TLS: " + said +
        (tls_alert && !alert_said
             ? " (the server closed the connection after the handshake: it refused the client certificate?)"
             : "");
    // An answer that is not TLS is no certificate problem.
    const bool not_tls = ep.tls && classify_tls_failure(t.rc, t.message) == TlsFailure::NotTls;
    return {Exchange::TlsFailed, error, not_tls ? Cause::NotTls : Cause::TlsRejected};
  }
  switch (t.rc) {
    case CURLE_COULDNT_CONNECT:
      if (t.connect_timed_out) return {Exchange::ConnectFailed, ep.text + ": connection timed out", Cause::None};
      if (t.connect_error != 0) {
        return {Exchange::ConnectFailed, ep.text + ": cannot connect: " + std::strerror(t.connect_error), Cause::None};
      }
      return {Exchange::ConnectFailed, why, Cause::None};
    case CURLE_COULDNT_RESOLVE_HOST: return {Exchange::ConnectFailed, why, Cause::None};
    case CURLE_OPERATION_TIMEDOUT:
      if (t.sent == 0) {
        return {Exchange::ConnectFailed,
                ep.text + (ep.tls ? ": connection or TLS handshake timed out" : ": connection timed out"), Cause::None};
      }
      return {Exchange::TimedOut, ep.text + ": no answer before the deadline", Cause::None};
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
      if (t.sent == 0 || nothing_back) {
        return {Exchange::ConnectFailed, ep.text + ": closed the connection without an answer", Cause::None};
      }
      return {Exchange::Broken, why, Cause::None};
    case CURLE_ABORTED_BY_CALLBACK:
      return {t.interrupted ? Exchange::Interrupted : Exchange::Broken, ep.text + ": interrupted by a signal",
              Cause::None};
    default: return {Exchange::Broken, why, Cause::None};
  }
}

Exchange CurlTransport::post(const Endpoint& ep, const Request& req, HttpResponse& out, std::string& error) {
  Transfer t = perform(ep, req);
  Classified c = classify_transfer(ep, t);
  out.cause = c.cause;
  if (c.exchange == Exchange::Ok) {
    out.status = static_cast<int>(t.status);
    out.body = std::move(t.body);
  } else {
    error = std::move(c.error);
  }
  return c.exchange;
}

}  // namespace looplock::etcd
