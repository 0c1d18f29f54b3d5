// The etcd client's HTTP exchange through libcurl: linked into looplock-etcd
// only. looplock itself is linked statically for its start-up time, which
// Debian's libcurl cannot be (libldap, libgssapi, libssh2, libpsl,
// libnghttp2 and librtmp ship no static archives) and which dynamic loading
// of libcurl's dependencies would cost every run, about 3 ms. So looplock
// hands a run with --etcd to looplock-etcd (cluster_exec.hpp), the same
// program linked with this transport.
//
// One easy handle, reused so that consecutive calls reuse the connection.
// Plain HTTP only; proxies from the environment are not used (the etcd
// gateway is reached directly); no signals (CURLOPT_NOSIGNAL), as looplock
// owns them. Sockets are close-on-exec, so none reaches the command: the
// connections' through CURLOPT_OPENSOCKETFUNCTION, and libcurl's internal
// wake-up socketpair (which libcurl 7.88 opens without it) by marking the
// sockets that were not open when the transport was made.
#pragma once

#include <curl/curl.h>

#include <set>

#include "etcd.hpp"

namespace looplock::etcd {

class CurlTransport final : public Transport {
public:
  CurlTransport();  // throws Fatal (71) when libcurl cannot be set up
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  Exchange post(const Endpoint& ep, std::string_view path, const std::string& body, long long connect_deadline_ns,
                long long deadline_ns, bool first_line_enough, HttpResponse& out, std::string& error) override;

private:
  void close_new_sockets_on_exec() const;

  CURL* easy_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::set<int> sockets_before_;  // inherited ones: they pass to the command as they came
};

}  // namespace looplock::etcd
