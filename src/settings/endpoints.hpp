// The etcd endpoints of --etcd and $LOOPLOCK_ETCD, parsed: a usage check
// that the static looplock makes itself, before it hands a run to
// looplock-etcd (cluster_exec.hpp), so that a bad endpoint is a usage error
// (64) whether or not the helper is installed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace looplock::etcd {

struct Endpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  bool tls = false;  // https://
  std::string text;  // "http://HOST:PORT" or "https://HOST:PORT", for URLs and messages
};

// "http[s]://HOST:PORT[,http[s]://HOST:PORT...]" (a trailing "/" is allowed);
// the error text for a usage message otherwise.
struct ParsedEndpoints {
  std::vector<Endpoint> endpoints;
  std::string error;  // empty when valid
};
ParsedEndpoints parse_endpoints(std::string_view text);

}  // namespace looplock::etcd
