// The etcd client's HTTP exchange through libcurl: linked into looplock-etcd
// only. looplock itself is linked statically for its start-up time, which
// Debian's libcurl cannot be (libldap, libgssapi, libssh2, libpsl,
// libnghttp2 and librtmp ship no static archives) and which dynamic loading
// of libcurl's dependencies would cost every run, about 4.5 ms (see
// docs/BENCHMARKS.md). So looplock
// hands a run with --etcd to looplock-etcd (cluster_exec.hpp), the same
// program linked with this transport.
//
// One easy handle, set up at the first request, whose connection cache keeps
// one connection per endpoint for the run (TLS handshakes once per endpoint).
// http:// and https:// (OpenSSL: the CA, client certificate and key of
// Security); proxies from the environment are not used (the etcd gateway is
// reached directly). Signals: libcurl sends none (CURLOPT_NOSIGNAL), and all are
// blocked while it works (see post()). Name lookups are bounded by the
// timeouts too (CURLOPT_QUICK_EXIT: a lookup that hangs is left behind).
// Sockets are close-on-exec, so none reaches the command: the connections'
// through CURLOPT_OPENSOCKETFUNCTION, and libcurl's internal wake-up
// socketpair (which libcurl 7.88 opens without it) by marking the sockets
// that were not open when the transport was made.
#pragma once

#include <curl/curl.h>

#include <set>
#include <string>
#include <string_view>

#include "cluster/etcd.hpp"

namespace looplock::etcd {

// How a failed TLS handshake (libcurl's `code`, OpenSSL's reason in
// `message`) ended, as far as it tells: the server sent a TLS alert, or
// nothing that reads as TLS (the connection closed or reset during the
// handshake, "SSL_ERROR_SYSCALL", "Connection reset by peer": etcd on a
// plain-HTTP port, which closes after reading a ClientHello; or "wrong version number",
// "packet length too long": a plain-HTTP answer read as a TLS record), or
// anything else (a certificate rejected here, a file that cannot be loaded).
enum class TlsFailure { Other, Alert, NoTlsAnswer, NotTls };
TlsFailure classify_tls_failure(CURLcode code, std::string_view message);

// What one transfer came to, as libcurl and looplock's probes saw it.
struct Transfer {
  CURLcode rc = CURLE_OK;
  long status = 0;      // the HTTP status (0: none)
  long sent = 0;        // bytes of request headers sent: 0 means no connection was made
  std::string message;  // libcurl's error buffer
  std::string body;
  bool too_large = false;  // the answer passed the size limit
  bool stopped = false;    // a stream said enough
  bool connect_timed_out = false;
  int connect_error = 0;
  bool interrupted = false;        // a signal of Request::interrupt_on ended it
  bool speaks_tls = false;         // an http:// endpoint that closed without an answer completes a TLS handshake
  bool speaks_plain_http = false;  // an https:// endpoint answers plain HTTP
};

// How a transfer ended, in the Transport's terms (pure: table-tested).
struct Classified {
  Exchange exchange = Exchange::Broken;
  std::string error;  // for anything but Ok
  Cause cause = Cause::None;
};
Classified classify_transfer(const Endpoint& ep, const Transfer& t);

class CurlTransport final : public Transport {
public:
  CurlTransport();  // only notes the open sockets: cannot fail
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void configure(const Security& security) override;
  // Throws Fatal (71) when libcurl cannot be set up.
  Exchange post(const Endpoint& ep, const Request& req, HttpResponse& out, std::string& error) override;

private:
  void set_up();
  void apply_security();
  void close_new_sockets_on_exec() const;
  // One POST: set up, performed, and the probes a failure needs.
  Transfer perform(const Endpoint& ep, const Request& req);
  void probe(const Endpoint& ep, const Request& req, Transfer& t);
  // Whether `ep` (an http:// endpoint that closed without an answer) completes
  // a TLS handshake: Cause::SpeaksTls.
  bool speaks_tls(const Endpoint& ep, Instant deadline) const;
  // Whether `ep` (an https:// endpoint that answered the handshake with
  // something else) answers a plain HTTP request: Cause::SpeaksPlainHttp.
  // Asked once per endpoint.
  bool speaks_plain_http(const Endpoint& ep, Instant deadline);

  Security security_;
  bool global_ = false;  // curl_global_init done
  CURL* easy_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::set<int> sockets_before_;                       // inherited ones: they pass to the command as they came
  bool looked_ = false;                                // close_new_sockets_on_exec() has run once
  std::set<std::string> plain_http_, not_plain_http_;  // endpoints speaks_plain_http() asked
};

}  // namespace looplock::etcd
