// libcurl's Transport against small loopback servers: how each way an
// exchange can end is reported (answer, stream, refused, silent, closed), and
// that its sockets are close-on-exec and proxies from the environment unused.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/duration.hpp"
#include "cluster/etcd_curl.hpp"
#include "os/posix/interrupts.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"

using namespace looplock;
using namespace looplock::etcd;

namespace {

using namespace std::chrono_literals;

// A loopback listening socket on a free port.
struct Listener {
  UniqueFd fd;
  int port = 0;
  Listener() : fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    REQUIRE(listen(fd.get(), 4) == 0);
  }
  Endpoint endpoint() const { return parse_endpoints("http://127.0.0.1:" + std::to_string(port)).endpoints.at(0); }
};

// Serves one connection: reads one request (head and Content-Length body)
// into `request`, writes `answer`, then closes unless `hold_ms` asks to keep
// the connection open that long (a stream that does not end).
std::thread serve_once(const Listener& l, std::string answer, std::string& request, int hold_ms = 0) {
  return std::thread([fd = l.fd.get(), answer = std::move(answer), &request, hold_ms] {
    UniqueFd c(accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) return;
    char buf[4096];
    for (;;) {
      auto head_end = request.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        auto cl = request.find("Content-Length: ");
        size_t length = cl == std::string::npos ? 0 : std::stoul(request.substr(cl + 16));
        if (request.size() >= head_end + 4 + length) break;
      }
      ssize_t n = read(c.get(), buf, sizeof buf);
      if (n <= 0) return;
      request.append(buf, static_cast<size_t>(n));
    }
    // No REQUIRE here (not the test's thread): a short write shows in the test's checks.
    if (!answer.empty()) sys::write_all(c.get(), answer);
    if (hold_ms > 0) usleep(static_cast<useconds_t>(hold_ms) * 1000);
  });
}

// Serves `requests` requests, on as many connections as the client opens
// (HTTP/1.1 keep-alive: each connection may carry several), answering each
// with `answer`; counts the connections it accepted. One thread, poll(2).
std::thread serve_kept(const Listener& l, std::string answer, int requests, std::vector<std::string>& seen,
                       int& connections) {
  return std::thread([fd = l.fd.get(), answer = std::move(answer), requests, &seen, &connections] {
    std::vector<UniqueFd> conns;
    std::vector<std::string> bufs;
    int served = 0;
    while (served < requests) {
      std::vector<pollfd> fds{{fd, POLLIN, 0}};
      for (const auto& c : conns) fds.push_back({c.get(), POLLIN, 0});
      if (poll(fds.data(), fds.size(), 5000) <= 0) return;
      if (fds[0].revents & POLLIN) {
        conns.emplace_back(accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
        bufs.emplace_back();
        ++connections;
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char chunk[4096];
        ssize_t n = read(fds[i].fd, chunk, sizeof chunk);
        if (n <= 0) continue;
        std::string& buf = bufs[i - 1];
        buf.append(chunk, static_cast<size_t>(n));
        for (;;) {
          auto head_end = buf.find("\r\n\r\n");
          if (head_end == std::string::npos) break;
          auto cl = buf.find("Content-Length: ");
          size_t length = cl == std::string::npos ? 0 : std::stoul(buf.substr(cl + 16));
          if (buf.size() < head_end + 4 + length) break;
          seen.push_back(buf.substr(0, head_end + 4 + length));
          buf.erase(0, head_end + 4 + length);
          sys::write_all(fds[i].fd, answer);
          ++served;
        }
      }
    }
  });
}

// One POST through the transport.
Exchange post(CurlTransport& t, const Endpoint& ep, std::string_view path, std::string_view body,
              Instant connect_deadline, Instant deadline, bool stream, HttpResponse& out, std::string& error,
              std::string_view token = {}, bool fresh = false) {
  Request req;
  req.path = path;
  req.body = body;
  req.token = token;
  req.connect_deadline = connect_deadline;
  req.deadline = deadline;
  if (stream) req.enough = [](std::string_view b) { return b.find('\n') != std::string_view::npos; };
  req.fresh_connection = fresh;
  return t.post(ep, req, out, error);
}

int sockets_without_cloexec() {
  int count = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (ec || !target.string().starts_with("socket:")) continue;
    int fd = std::stoi(e.path().filename().string());
    if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC)) ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("an answer: the POST as sent, the status and body as received") {
  setenv("http_proxy", "http://127.0.0.1:1", 1);  // must not be used
  CurlTransport t;
  Listener l;
  std::string request;
  auto server = serve_once(l, "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope", request);
  HttpResponse out;
  std::string error;
  const Instant now = MonotonicClock::now();
  auto ex = post(t, l.endpoint(), "/v3/kv/range", R"({"key":"aw=="})", now + 1000ms, now + 5000ms, false, out, error);
  server.join();
  unsetenv("http_proxy");
  CHECK(ex == Exchange::Ok);
  CHECK(out.status == 404);
  CHECK(out.body == "nope");
  CHECK(request.starts_with("POST /v3/kv/range HTTP/1.1\r\n"));
  CHECK(request.find("Content-Type: application/json\r\n") != std::string::npos);
  CHECK(request.ends_with("\r\n\r\n{\"key\":\"aw==\"}"));
  CHECK(sockets_without_cloexec() == 0);
}

TEST_CASE("a stream that does not end: its first line is the answer") {
  CurlTransport t;
  Listener l;
  std::string request;
  auto server = serve_once(l,
                           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "20\r\n{\"result\":{\"ID\":\"7\",\"TTL\":\"9\"}}\n\r\n",
                           request, 3000);
  HttpResponse out;
  std::string error;
  const Instant start = MonotonicClock::now();
  auto ex = post(t, l.endpoint(), "/v3/watch", R"({"ID":"7"})", start + 1000ms, start + 2000ms, true, out, error);
  const Duration took = MonotonicClock::now() - start;
  server.join();
  CHECK(ex == Exchange::Ok);
  CHECK(out.status == 200);
  CHECK(out.body == "{\"result\":{\"ID\":\"7\",\"TTL\":\"9\"}}\n");
  CHECK(took < 1500ms);  // did not wait for the stream's end
}

namespace {
// SIGUSR1 blocked and pending, as the job loop leaves a signal for itself to
// take after post(); taken() says it is still pending, and takes it.
struct PendingUsr1 {
  sigset_t usr1, old;
  PendingUsr1() {
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    REQUIRE(pthread_sigmask(SIG_BLOCK, &usr1, &old) == 0);
    REQUIRE(raise(SIGUSR1) == 0);
  }
  bool taken() {
    const timespec zero{0, 0};
    return sigtimedwait(&usr1, nullptr, &zero) == SIGUSR1;
  }
  ~PendingUsr1() {
    (void)taken();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
};
}  // namespace

TEST_CASE("a pending signal of interrupt_on ends a request that gets no answer, within about a second") {
  CurlTransport t;
  Listener l;  // connected, never answered
  PendingUsr1 pending;
  Request req;
  req.path = "/v3/lease/keepalive";
  req.body = "{}";
  const Instant start = MonotonicClock::now();
  req.connect_deadline = start + 1000ms;
  req.deadline = start + 10'000ms;
  const looplock::sys::Interrupts usr1{pending.usr1};
  req.interrupt_on = &usr1;
  HttpResponse out;
  std::string error;
  const Exchange ex = t.post(l.endpoint(), req, out, error);
  const Duration took = MonotonicClock::now() - start;
  CHECK(ex == Exchange::Interrupted);
  CHECK(error.find("interrupted by a signal") != std::string::npos);
  CHECK(took < 5000ms);
  CHECK(pending.taken());  // still pending, for the caller
}

TEST_CASE("without interrupt_on, a blocked pending signal leaves the request alone") {
  CurlTransport t;
  Listener l;
  PendingUsr1 pending;
  HttpResponse out;
  std::string error;
  const Instant start = MonotonicClock::now();
  CHECK(post(t, l.endpoint(), "/v3/kv/range", "{}", start + 1000ms, start + 1500ms, false, out, error) ==
        Exchange::TimedOut);
  CHECK(pending.taken());
}

TEST_CASE("a refused connection is ConnectFailed") {
  int port = 0;
  {
    Listener l;  // bound, then closed: nothing listens there now
    port = l.port;
  }
  CurlTransport t;
  HttpResponse out;
  std::string error;
  const Instant now = MonotonicClock::now();
  auto ep = parse_endpoints("http://127.0.0.1:" + std::to_string(port)).endpoints.at(0);
  CHECK(post(t, ep, "/v3/kv/range", "{}", now + 1000ms, now + 2000ms, false, out, error) == Exchange::ConnectFailed);
  CHECK(error.starts_with(ep.text + ": "));
}

TEST_CASE("a server that takes the request and never answers is TimedOut, on time") {
  CurlTransport t;
  Listener l;  // the kernel completes the connection; nobody reads or answers
  HttpResponse out;
  std::string error;
  const Instant start = MonotonicClock::now();
  auto ex = post(t, l.endpoint(), "/v3/kv/range", "{}", start + 1000ms, start + 300ms, false, out, error);
  const Duration took = MonotonicClock::now() - start;
  CHECK(ex == Exchange::TimedOut);
  CHECK(error.find("no answer before the deadline") != std::string::npos);
  CHECK(took >= 250ms);
  CHECK(took < 2000ms);
}

TEST_CASE("a connection closed without an answer is ConnectFailed (the next endpoint is tried)") {
  CurlTransport t;
  Listener l;
  std::string request;
  auto server = serve_once(l, "", request);
  HttpResponse out;
  std::string error;
  const Instant now = MonotonicClock::now();
  auto ex = post(t, l.endpoint(), "/v3/kv/put", "{}", now + 1000ms, now + 2000ms, false, out, error);
  server.join();
  CHECK(ex == Exchange::ConnectFailed);
  CHECK(error.find("without an answer") != std::string::npos);
}

TEST_CASE("one kept connection per endpoint; a fresh one when asked; the auth token as a header") {
  CurlTransport t;
  Listener l;
  std::vector<std::string> seen;
  int connections = 0;
  auto server = serve_kept(l, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 4, seen, connections);
  HttpResponse out;
  std::string error;
  for (int i = 0; i < 4; ++i) {
    const Instant now = MonotonicClock::now();
    CHECK(post(t, l.endpoint(), "/v3/kv/range", "{}", now + 1000ms, now + 2000ms, false, out, error,
               i == 1 ? "tok.1" : "", i == 3) == Exchange::Ok);
  }
  server.join();
  CHECK(connections == 2);  // requests 0-2 on one connection, 3 on a fresh one
  REQUIRE(seen.size() == 4);
  CHECK(seen[1].find("Authorization: tok.1\r\n") != std::string::npos);
  CHECK(seen[0].find("Authorization") == std::string::npos);
  CHECK(seen[2].find("Authorization") == std::string::npos);
  CHECK(sockets_without_cloexec() == 0);
}

TEST_CASE("a kept connection whose server went away: the next request connects again") {
  CurlTransport t;
  Listener l;
  std::string first, second;
  HttpResponse out;
  std::string error;
  auto server = serve_once(l, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", first);
  Instant now = MonotonicClock::now();
  CHECK(post(t, l.endpoint(), "/v3/kv/range", "{}", now + 1000ms, now + 2000ms, false, out, error) == Exchange::Ok);
  server.join();  // and closed its end
  server = serve_once(l, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", second);
  now = MonotonicClock::now();
  CHECK(post(t, l.endpoint(), "/v3/kv/range", "{}", now + 1000ms, now + 2000ms, false, out, error) == Exchange::Ok);
  server.join();
  CHECK(second.starts_with("POST /v3/kv/range"));
}

TEST_CASE("https:// to a plain-HTTP server fails as a TLS failure that says to use http://") {
  // closes: the server reads the ClientHello and closes without a word (etcd).
  for (auto [answers_http, closes] : {std::pair{true, false}, {false, false}, {true, true}}) {
    CAPTURE(answers_http);
    CAPTURE(closes);
    CurlTransport t;
    Listener l;
    // A plain HTTP server answers the TLS ClientHello as a bad request; then
    // (answers_http) looplock's plain GET /version, or (not) it closes.
    std::string probe;
    auto server = std::thread([fd = l.fd.get(), answers_http, closes, &probe] {
      for (int i = 0; i < 2; ++i) {
        UniqueFd c(accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
        if (!c) return;
        char buf[4096];
        const ssize_t n = read(c.get(), buf, sizeof buf);
        if (n <= 0) return;
        if (i == 1) probe.assign(buf, static_cast<size_t>(n));
        if ((i == 0 && !closes) || (i == 1 && answers_http)) {
          sys::write_all(c.get(), "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
      }
    });
    HttpResponse out;
    std::string error;
    auto ep = parse_endpoints("https://127.0.0.1:" + std::to_string(l.port)).endpoints.at(0);
    const Instant now = MonotonicClock::now();
    auto ex = post(t, ep, "/v3/kv/range", "{}", now + 1000ms, now + 2000ms, false, out, error);
    server.join();
    CHECK(ex == Exchange::TlsFailed);
    CHECK(error.find("TLS") != std::string::npos);
    if (!closes) CHECK(error.find("wrong version number") != std::string::npos);
    CHECK(out.cause != looplock::etcd::Cause::TlsRejected);  // no certificate problem
    if (answers_http) {
      CHECK(probe.starts_with("GET /version HTTP/1.1"));
      CHECK(error.find("the endpoint speaks plain HTTP") != std::string::npos);
      CHECK(out.cause == looplock::etcd::Cause::SpeaksPlainHttp);
    } else {
      CHECK(out.cause == looplock::etcd::Cause::NotTls);
    }
  }
}

TEST_CASE("a blackholed endpoint is ConnectFailed at the connect deadline, not the request's") {
  // A listener whose accept queue is full drops every SYN: a connect hangs.
  UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(l);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  REQUIRE(listen(l.get(), 0) == 0);
  std::vector<UniqueFd> fillers;
  for (int i = 0; i < 2; ++i) {
    fillers.emplace_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    (void)connect(fillers.back().get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  pollfd first{fillers[0].get(), POLLOUT, 0};  // until the first filler's handshake is done (it fills the queue)
  REQUIRE(poll(&first, 1, 2000) == 1);
  CurlTransport t;
  HttpResponse out;
  std::string error;
  auto ep = parse_endpoints("http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))).endpoints.at(0);
  const Instant start = MonotonicClock::now();
  auto ex = post(t, ep, "/v3/kv/range", "{}", start + 60ms, start + 3000ms, false, out, error);
  const Duration took = MonotonicClock::now() - start;
  CHECK(ex == Exchange::ConnectFailed);
  CHECK(error.find("connection timed out") != std::string::npos);
  CHECK(took >= 55ms);
  CHECK(took < 1000ms);
  CHECK(sockets_without_cloexec() == 0);
}

TEST_CASE("a failed TLS handshake: an alert, no TLS answer, not TLS at all, or something else") {
  // https:// to a plain-HTTP port: its "HTTP/1.1 400" read as a TLS record, or
  // (etcd) the connection closed in the middle of the handshake.
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR,
                             "OpenSSL/3.0.19: error:0A00010B:SSL routines::wrong version number") ==
        TlsFailure::NotTls);
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR, "error:0A0000C6:SSL routines::packet length too long") ==
        TlsFailure::NotTls);
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR,
                             "OpenSSL SSL_connect: SSL_ERROR_SYSCALL in connection to 127.0.0.1:2379 ") ==
        TlsFailure::NoTlsAnswer);
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR, "error:0A000126:SSL routines::unexpected eof while reading") ==
        TlsFailure::NoTlsAnswer);
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR, "Recv failure: Connection reset by peer") ==
        TlsFailure::NoTlsAnswer);
  CHECK(classify_tls_failure(CURLE_RECV_ERROR, "Recv failure: Connection reset by peer") == TlsFailure::NoTlsAnswer);
  CHECK(classify_tls_failure(CURLE_GOT_NOTHING, "") == TlsFailure::NoTlsAnswer);
  // A TLS server that refused something: certificates, not the scheme.
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR, "error:0A000410:SSL routines::sslv3 alert handshake failure") ==
        TlsFailure::Alert);
  CHECK(classify_tls_failure(CURLE_RECV_ERROR, "error:0A00045C:SSL routines::tlsv13 alert certificate required") ==
        TlsFailure::Alert);
  CHECK(classify_tls_failure(CURLE_PEER_FAILED_VERIFICATION,
                             "SSL certificate problem: unable to get local issuer certificate") == TlsFailure::Other);
  CHECK(classify_tls_failure(CURLE_SSL_CERTPROBLEM, "could not load PEM client certificate") == TlsFailure::Other);
  CHECK(classify_tls_failure(CURLE_SSL_CONNECT_ERROR, "") == TlsFailure::Other);
}

TEST_CASE("classify_transfer: how a transfer ended, from what libcurl and the probes saw") {
  Endpoint plain{.host = "127.0.0.1", .port = 2379, .tls = false, .text = "http://127.0.0.1:2379"};
  Endpoint tls{.host = "127.0.0.1", .port = 2379, .tls = true, .text = "https://127.0.0.1:2379"};
  auto transfer = [](CURLcode rc) {
    Transfer t;
    t.rc = rc;
    return t;
  };
  struct Row {
    const char* what;
    Endpoint ep;
    Transfer t;
    Exchange exchange;
    Cause cause;
    const char* error_has;
  };
  Transfer ok = transfer(CURLE_OK);
  ok.status = 200;
  ok.body = "{}";
  Transfer https_answer = ok;
  https_answer.status = 400;
  https_answer.body = "Client sent an HTTP request to an HTTPS server.";
  Transfer stopped = transfer(CURLE_WRITE_ERROR);
  stopped.stopped = true;
  Transfer big = transfer(CURLE_WRITE_ERROR);
  big.too_large = true;
  Transfer tls_port = transfer(CURLE_GOT_NOTHING);
  tls_port.speaks_tls = true;
  Transfer plain_port = transfer(CURLE_SSL_CONNECT_ERROR);
  plain_port.message = "error:0A00010B:SSL routines::wrong version number";
  plain_port.speaks_plain_http = true;
  Transfer bad_ca = transfer(CURLE_PEER_FAILED_VERIFICATION);
  bad_ca.message = "SSL certificate problem: unable to get local issuer certificate";
  Transfer refused_cert = transfer(CURLE_RECV_ERROR);
  Transfer timed_connect = transfer(CURLE_COULDNT_CONNECT);
  timed_connect.connect_timed_out = true;
  Transfer refused = transfer(CURLE_COULDNT_CONNECT);
  refused.connect_error = ECONNREFUSED;
  Transfer silent = transfer(CURLE_OPERATION_TIMEDOUT);
  silent.sent = 100;
  Transfer no_connection = transfer(CURLE_OPERATION_TIMEDOUT);
  Transfer cut = transfer(CURLE_RECV_ERROR);
  cut.sent = 100;
  cut.body = "{\"par";
  Transfer closed = transfer(CURLE_GOT_NOTHING);
  closed.sent = 100;
  Transfer signal = transfer(CURLE_ABORTED_BY_CALLBACK);
  signal.interrupted = true;
  const Row rows[] = {
      {"an answer", plain, ok, Exchange::Ok, Cause::None, ""},
      {"a TLS port's answer to plain HTTP", plain, https_answer, Exchange::Ok, Cause::SpeaksTls, ""},
      {"a stream that said enough", plain, stopped, Exchange::Ok, Cause::None, ""},
      {"an answer too large", plain, big, Exchange::Broken, Cause::None, "answer too large"},
      {"plain HTTP to a TLS port", plain, tls_port, Exchange::ConnectFailed, Cause::SpeaksTls, "speaks TLS"},
      {"TLS to a plain-HTTP port", tls, plain_port, Exchange::TlsFailed, Cause::SpeaksPlainHttp, "speaks plain HTTP"},
      {"a certificate not trusted", tls, bad_ca, Exchange::TlsFailed, Cause::TlsRejected, "unable to get local issuer"},
      {"closed after the handshake", tls, refused_cert, Exchange::TlsFailed, Cause::TlsRejected, "refused the client"},
      {"a connect that timed out", plain, timed_connect, Exchange::ConnectFailed, Cause::None, "connection timed out"},
      {"a connect refused", plain, refused, Exchange::ConnectFailed, Cause::None, "Connection refused"},
      {"sent, no answer in time", plain, silent, Exchange::TimedOut, Cause::None, "no answer before the deadline"},
      {"no connection in time", tls, no_connection, Exchange::ConnectFailed, Cause::None, "TLS handshake timed out"},
      {"an answer cut short", plain, cut, Exchange::Broken, Cause::None, ""},
      {"closed without an answer", plain, closed, Exchange::ConnectFailed, Cause::None, "without an answer"},
      {"a signal", plain, signal, Exchange::Interrupted, Cause::None, "interrupted by a signal"},
  };
  for (const Row& r : rows) {
    CAPTURE(r.what);
    const Classified c = classify_transfer(r.ep, r.t);
    CHECK(c.exchange == r.exchange);
    CHECK(c.cause == r.cause);
    CHECK(c.error.find(r.error_has) != std::string::npos);
    if (c.exchange != Exchange::Ok) CHECK(c.error.starts_with(r.ep.text + ": "));
  }
}
