// A small etcd v3 client for the cluster lock (--etcd): the HTTP/JSON gateway
// of etcd 3.4+ (POST /v3/..., bytes fields in base64, int64 fields as
// strings). This file is the protocol; the HTTP exchange itself is a
// Transport, libcurl's in looplock-etcd (etcd_curl.hpp).
//
// Every call has a deadline (CLOCK_MONOTONIC ns): connecting to an endpoint is
// bounded by a connect timeout and the deadline, and the whole exchange by the
// deadline, so a dead or frozen endpoint never hangs looplock. Endpoints are
// tried in order (starting with the last one that answered) until one
// accepts the connection. Nothing here throws across the module boundary:
// results are typed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "log.hpp"

namespace looplock::etcd {

struct Endpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  std::string text;  // as given, for messages
};

// "http://HOST:PORT[,http://HOST:PORT...]" (a trailing "/" is allowed); the
// error text for a usage message otherwise.
struct ParsedEndpoints {
  std::vector<Endpoint> endpoints;
  std::string error;  // empty when valid
};
ParsedEndpoints parse_endpoints(std::string_view text);

// Standard base64 (RFC 4648, with padding), as the gateway encodes bytes.
std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

// The prefix after which a string sorts beyond every key that starts with
// `prefix` (etcd's range_end for a prefix range): the prefix with its last
// byte below 0xff incremented; "\0" when there is none.
std::string prefix_range_end(std::string_view prefix);

// The keys looplock uses for lock NAME. The etcd lock service keeps one key
// per contender, "<lock_prefix>/<lease id in hex>"; the holder value lives
// beside it, outside that prefix (inside it, it would count as a contender).
inline constexpr std::string_view kKeyRoot = "looplock/";
std::string lock_service_name(std::string_view name);  // "looplock/NAME/lock"
std::string holder_key(std::string_view name);         // "looplock/NAME/holder"

// The lease id as etcdctl prints it (lower-case hex), which is also the last
// part of the lock key.
std::string lease_hex(long long id);

// Request bodies (pure; unit-tested).
std::string lease_grant_body(int ttl_s);
std::string lease_id_body(long long id);  // keepalive, revoke
std::string lock_body(std::string_view name, long long lease);
std::string unlock_body(std::string_view key);
std::string range_body(std::string_view key, bool prefix);
std::string put_body(std::string_view key, std::string_view value, long long lease);

struct KeyValue {
  std::string key;
  std::string value;
  long long create_revision = 0;
  long long mod_revision = 0;
  long long lease = 0;
};

// What a gateway answer says; nullopt when malformed. A keepalive or
// streaming answer is {"result": {...}}; the inner object is used.
std::optional<Json> parse_answer(std::string_view body);
// An int64 field, which the gateway writes as a string ("123") and accepts as
// either; 0 when missing (proto3 leaves out zero values).
std::optional<long long> int64_field(const Json& j, const char* name);
std::optional<long long> parse_lease_grant(const Json& answer);   // the lease id
long long parse_keepalive_ttl(const Json& answer);                 // 0: the lease is gone
std::optional<std::string> parse_lock_key(const Json& answer);     // the decoded key
std::optional<std::vector<KeyValue>> parse_range(const Json& answer);

// How a call ended.
enum class Status {
  Ok,
  Unavailable,  // no endpoint accepted a connection (refused, unreachable, connect timeout)
  Timeout,      // an endpoint accepted the request but did not answer before the deadline
  Failed,       // the server answered with an error, or with something unreadable
};
std::string_view status_name(Status s);

template <typename T>
struct Result {
  Status status = Status::Failed;
  T value{};
  std::string error;  // for messages, when not Ok
  bool ok() const { return status == Status::Ok; }
};

// One HTTP POST to one endpoint, and how it ended.
struct HttpResponse {
  int status = 0;
  std::string body;
};
enum class Exchange {
  Ok,
  ConnectFailed,  // no connection (refused, unresolvable, connect timeout) or closed before any answer
  TimedOut,       // connected and sent, but no whole answer before the deadline
  Broken,         // a broken or unreadable answer
};
class Transport {
public:
  virtual ~Transport() = default;
  // POSTs `body` (JSON) to `ep.text + path`. Connecting must end by
  // `connect_deadline_ns`, the whole exchange by `deadline_ns`. With
  // `first_line_enough`, the answer is complete as soon as its body holds one
  // whole line (a streaming answer, such as a keepalive's, never ends by
  // itself). `error` describes anything but Ok.
  virtual Exchange post(const Endpoint& ep, std::string_view path, const std::string& body,
                        long long connect_deadline_ns, long long deadline_ns, bool first_line_enough,
                        HttpResponse& out, std::string& error) = 0;
};

class Client {
public:
  Client(Transport& transport, std::vector<Endpoint> endpoints, long long connect_timeout_ns = 1'000'000'000LL)
      : transport_(transport), endpoints_(std::move(endpoints)), connect_timeout_ns_(connect_timeout_ns) {}

  Result<long long> lease_grant(int ttl_s, long long deadline_ns);
  // The lease's remaining TTL in seconds; 0 when etcd says the lease is gone.
  Result<long long> lease_keepalive(long long id, long long deadline_ns);
  Result<bool> lease_revoke(long long id, long long deadline_ns);
  // Waits server-side until NAME is acquired with the lease: the deadline
  // bounds it (Timeout then). Returns the lock key.
  Result<std::string> lock(std::string_view name, long long lease, long long deadline_ns);
  Result<bool> unlock(std::string_view key, long long deadline_ns);
  Result<std::vector<KeyValue>> range(std::string_view key, bool prefix, long long deadline_ns);
  Result<bool> put(std::string_view key, std::string_view value, long long lease, long long deadline_ns);

  // The endpoint that answered last ("http://127.0.0.1:2379").
  const std::string& current_endpoint() const { return endpoints_[first_].text; }

private:
  Result<Json> call(std::string_view path, const std::string& body, long long deadline_ns);

  Transport& transport_;
  std::vector<Endpoint> endpoints_;
  long long connect_timeout_ns_;
  size_t first_ = 0;
};

}  // namespace looplock::etcd
