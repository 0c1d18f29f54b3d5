// A small etcd v3 client for the cluster lock (--etcd): the HTTP/JSON gateway
// of etcd 3.4+ (POST /v3/..., bytes fields in base64, int64 fields as
// strings). This file is the protocol; the HTTP exchange itself is a
// Transport, libcurl's in looplock-etcd (etcd_curl.hpp).
//
// Every call has a deadline (CLOCK_MONOTONIC ns) and is made of attempts,
// each bounded by its own, shorter, timeout: an attempt that cannot connect,
// times out, or meets a transient error (no leader, leader changed, too many
// requests) goes on to the next endpoint at once, so a dead, frozen or
// partitioned member costs one attempt, not the call. After a round over every
// endpoint, the next round waits a little (25 ms, doubling, up to a quarter of an
// attempt and at most 400 ms) and doubles the attempt and connect timeouts,
// so a slow but healthy cluster is still reached. Only calls that may be repeated safely are retried (all of
// the cluster lock's are: see cluster.cpp). A call's failure is a typed
// result (Status, Cause), not an exception; only a Transport that cannot be
// set up throws (Fatal), and memory running out (std::bad_alloc). Time comes
// from a Clock, so that unit tests can run the deadline arithmetic without
// waiting.
#pragma once


#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.hpp"
#include "os/clock.hpp"
#include "os/interrupts.hpp"
#include "settings/endpoints.hpp"

namespace looplock::etcd {

// Standard base64 (RFC 4648, with padding), as the gateway encodes bytes.
std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

// The prefix after which a string sorts beyond every key that starts with
// `prefix` (etcd's range_end for a prefix range): the prefix with its last
// byte below 0xff incremented; "\0" when there is none.
std::string prefix_range_end(std::string_view prefix);

// The keys looplock uses for lock NAME: one key per contender,
// "<lock_prefix>/<lease id in hex>" (the layout of etcd's own lock service and
// of etcdctl lock, so they exclude each other), whose value is the
// contender's holder JSON. Earlier versions (etcd's lock service) wrote the holder value beside
// the prefix, under holder_key(); --inspect still reads it there.
//
// NAME is one segment of the key: itself when it holds neither '/' nor '%'
// (the keys of every earlier version), otherwise percent-encoded, '%' as
// "%25" and '/' as "%2F" (every other byte as it is). The encoding is
// injective: an encoded name holds a '%' and a name kept as it is does not,
// and "%25" and "%2F" decode one way only. No segment holds a '/', so no
// name's prefix lies under another's (earlier versions put "x/lock/y"'s keys
// under "x"'s prefix: the two excluded each other).
//
// For an encoded name, earlier versions (and etcdctl lock looplock/NAME/lock)
// used the unencoded prefix, legacy_lock_prefix(): a contender writes its key
// there too (the same lease, the same transaction, so the same create
// revision), so that they see it, and counts theirs there as contenders.
// Except for a name that is itself another name's encoding (no '/', every
// '%' beginning "%25" or "%2F": "x%2Flock%2Fy" is "x/lock/y"'s): its
// unencoded prefix is that name's encoded prefix, whose keys are that name's.
//
// A contender's key is its prefix and one more segment, the lease id: a key
// deeper under a prefix ("looplock/x/lock/y/lock/<lease>" under "x"'s) is
// another name's, and is not counted (is_contender_key()).
inline constexpr std::string_view kKeyRoot = "looplock/";
std::string lock_key_name(std::string_view name);       // NAME, or NAME percent-encoded
bool lock_name_encoded(std::string_view name);          // lock_key_name(name) != name
std::string lock_service_name(std::string_view name);   // "looplock/<key name>/lock"
std::string lock_prefix(std::string_view name);         // "looplock/<key name>/lock/"
std::string legacy_lock_prefix(std::string_view name);  // "looplock/NAME/lock/", as earlier versions wrote it
// Where NAME's contenders' keys lie: lock_prefix(), then legacy_lock_prefix()
// when NAME is encoded and is not another name's encoding.
std::vector<std::string> contender_prefixes(std::string_view name);
// Whether `name` is what lock_key_name() makes of some name that it changes
// or keeps: no '/', and every '%' begins "%25" or "%2F".
bool is_lock_key_name(std::string_view name);
bool is_contender_key(std::string_view prefix, std::string_view key);
std::string holder_key(std::string_view name);  // "looplock/NAME/holder" (earlier versions: unencoded)
// The run ledger of --once-per: one key per operation, outside the
// contenders' prefix and without a lease (releasing must not delete it),
// the operation encoded as names are: "looplock/<key name>/runs/<key op>".
std::string runs_prefix(std::string_view name);
std::string runs_key(std::string_view name, std::string_view operation);

// The lease id as etcdctl prints it (lower-case hex), which is also the last
// part of the lock key.
std::string lease_hex(long long id);
// -p coalesce: where the runs a waiter (its lease, `waiter_lease`) absorbed
// put a key each, without a lease: "looplock/<key name>/absorbed/<waiter
// lease hex>/<absorbed run's lease hex>". The waiter deletes them when it
// takes the lock (it runs for them) or when its wait ends (it says so); a
// waiter that died leaves them behind, for the next run that takes the lock
// and --inspect to name (cluster.cpp).
std::string absorbed_root(std::string_view name);
std::string absorbed_prefix(std::string_view name, long long waiter_lease);
// The waiter's lease named by a key under absorbed_root() (nullopt: not such a key).
std::optional<long long> absorbed_waiter_lease(std::string_view root, std::string_view key);
// A lease id as lease_hex() writes it (nullopt when it is not one).
std::optional<long long> parse_lease_hex(std::string_view hex);

// gRPC status codes, as the gateway reports them (a Result's `code`).
namespace grpc_code {
inline constexpr int kInvalidArgument = 3;
inline constexpr int kDeadlineExceeded = 4;
inline constexpr int kNotFound = 5;  // "requested lease not found", among others
inline constexpr int kPermissionDenied = 7;
inline constexpr int kResourceExhausted = 8;
inline constexpr int kFailedPrecondition = 9;
inline constexpr int kUnavailable = 14;
inline constexpr int kUnauthenticated = 16;
}  // namespace grpc_code

// A range, as a request of its own or inside a txn.
struct RangeQuery {
  std::string key;
  bool prefix = false;  // every key starting with `key`
  long long limit = 0;  // 0: all
  enum class Order { None, FirstCreated, LastCreated } order = Order::None;
  long long max_create_revision = 0;  // 0: any
};

// Request bodies (pure; unit-tested).
std::string lease_grant_body(int ttl_s);
std::string lease_id_body(long long id);  // keepalive, revoke
std::string range_body(const RangeQuery& q);
std::string put_body(std::string_view key, std::string_view value, long long lease);
std::string authenticate_body(std::string_view user, std::string_view password);
// Watches `key` for its deletion from `start_revision` on (puts filtered
// out); with `range_end`, every key from `key` up to it (a prefix's range:
// prefix_range_end()).
std::string watch_delete_body(std::string_view key, long long start_revision, std::string_view range_end = {});
// The cluster lock's transactions, over the lock's `prefixes`
// (contender_prefixes()) and `keys` (a contender's key under each prefix, in
// the same order). queue: if keys[0] does not exist, create every key with
// `value` under `lease`; either way read every prefix, by create revision,
// in the same transaction (see cluster.cpp):
//   success: put each key; range each prefix first-created
//   failure: range keys[0]; range each prefix first-created
// With `also_read`, both branches end with a read of that key (the run
// ledger's, inside the acquisition's own transaction).
std::string queue_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                           const std::vector<std::string>& prefixes, std::string_view also_read = {});
// single_flight: create the keys only if no key under any prefix exists;
//   failure: range each prefix first-created (who holds or waits; keys of
//   other names deeper under a prefix fail the compare too: cluster.cpp then
//   queues and looks).
std::string create_if_free_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                                    const std::vector<std::string>& prefixes, std::string_view also_read = {});
// Puts `value` at `key` (no lease) only if `guard_key` is still the key
// created at `guard_create_revision` (the holder's lock key: its fencing
// token) and `key` is still at `mod_revision` (0: absent): a holder that
// lost its lease, or a write that raced another, cannot write.
std::string guarded_put_txn_body(std::string_view guard_key, long long guard_create_revision, std::string_view key,
                                 long long mod_revision, std::string_view value);
// -p coalesce, a run absorbed by a waiter: puts `value` at `key` (no lease)
// and deletes the run's own keys (`leave`: it leaves the queue), only if
// each of `guards` (a key, its create revision) is still that key (the
// waiter still waits: cluster.cpp) and nothing is under any of
// `empty_prefixes` (no run noted itself under this one); else reads them.
std::string absorb_txn_body(const std::vector<std::pair<std::string, long long>>& guards,
                            const std::vector<std::string>& empty_prefixes, std::string_view key,
                            std::string_view value, const std::vector<std::string>& leave);
// Reads, in one transaction: each of `prefixes`, first created first.
std::string reads_txn_body(const std::vector<std::string>& prefixes);
// Reads every key under each of `prefixes` and deletes them, and deletes
// `keys`, in one transaction (the counts read are what was deleted).
std::string take_prefixes_txn_body(const std::vector<std::string>& prefixes, const std::vector<std::string>& keys = {});
// Deletes every key under each of `prefixes`, and `keys`, unconditionally.
std::string delete_prefixes_txn_body(const std::vector<std::string>& prefixes, const std::vector<std::string>& keys = {});
// Rewrites the keys' value (same lease) only if keys[0] is still the key
// created at `create_revision` (never recreates a key that expired meanwhile).
std::string update_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                            long long create_revision);

struct KeyValue {
  std::string key;
  std::string value;
  long long create_revision = 0;
  long long mod_revision = 0;
  long long lease = 0;
};

struct RangeResult {
  long long revision = 0;  // the store's revision the read saw
  std::vector<KeyValue> kvs;
  long long count = 0;  // all keys in the range (kvs may be limited)
};

struct TxnResult {
  bool succeeded = false;
  long long revision = 0;           // the header's: a put's create revision when it created the key
  std::vector<RangeResult> ranges;  // the range responses, in order
};


// The contenders of a lock in the order they take it (by create revision),
// from the ranges of its prefixes (`ranges[i]` read `prefixes[i]`): only
// contender keys (is_contender_key()), and each contender once (its keys
// under both prefixes share a create revision; the first prefix's is kept).
std::vector<KeyValue> contenders(const std::vector<std::string>& prefixes, const std::vector<RangeResult>& ranges);

// What a gateway answer says; nullopt when malformed. A stream's answer is
// {"result": {...}} per line; the first line's inner object is used.
std::optional<Json> parse_answer(std::string_view body);
// An int64 field, which the gateway writes as a string ("123") and accepts as
// either; 0 when missing (proto3 leaves out zero values).
std::optional<long long> int64_field(const Json& j, const char* name);
std::optional<long long> parse_lease_grant(const Json& answer);  // the lease id
long long parse_keepalive_ttl(const Json& answer);               // 0: the lease is gone
std::optional<std::vector<KeyValue>> parse_kvs(const Json& answer);
std::optional<RangeResult> parse_range(const Json& answer);
std::optional<TxnResult> parse_txn(const Json& answer);
std::optional<std::string> parse_token(const Json& answer);

// A watch stream as received so far (one JSON object per line).
struct WatchProgress {
  bool created = false;
  bool deleted = false;   // a DELETE event arrived
  bool canceled = false;  // etcd ended the watch (compacted, no leader, ...): read again
  bool ended = false;     // the stream itself ended (an error frame: its Grpc-Timeout passed, ...)
  bool deadline = false;  // the error frame says the deadline passed (code 4, or etcd's gateway's code 2
                          // with "context deadline exceeded", which it sends now and then)
  std::string reason;     // why it was canceled, when etcd says
  bool malformed = false;
};
WatchProgress parse_watch(std::string_view body);

// How a call ended.
enum class Status {
  Ok,
  Unavailable,  // no endpoint could be reached (refused, unreachable, connect or TLS failure)
  Timeout,      // reached, but no answer before the deadline (or only transient errors)
  Failed,       // the server answered with an error, or with something unreadable
  Interrupted,  // a signal of Deadline::interrupt_on ended it before an answer
};
std::string_view status_name(Status s);

// Why a call failed, when the cause has a known fix; the cluster lock words
// the fix in looplock's options (cluster.cpp): this layer knows only etcd.
enum class Cause {
  None,
  SpeaksTls,          // a plain-HTTP request to an endpoint that speaks TLS
  SpeaksPlainHttp,    // a TLS handshake with an endpoint that speaks plain HTTP
  NotTls,             // a TLS handshake answered by something that is not TLS (nor etcd's HTTP)
  TlsRejected,        // the handshake failed: a certificate not trusted, or the client's refused
  CommonNameRefused,  // etcd's gateway refuses a client certificate with a CommonName under authentication
  PermissionDenied,   // the etcd user lacks permission on the keys
  BadCredentials,     // the etcd user or its password was refused
};

template <typename T>
struct Result {
  Status status = Status::Failed;
  T value{};
  std::string error;           // for messages, when not Ok
  Cause cause = Cause::None;   // when it has a known fix
  std::string cause_endpoint;  // the endpoint the cause is about ("http://HOST:PORT")
  int code = 0;                // etcd's gRPC code of a Failed answer (5: not found, 7: permission denied, ...)
  Instant sent{};              // when the attempt that succeeded began
  bool ok() const { return status == Status::Ok; }
};

// One HTTP POST to one endpoint, and how it ended.
struct HttpResponse {
  int status = 0;
  std::string body;
  Cause cause = Cause::None;  // a cause the transport recognised (a TLS port spoken to in plain HTTP, ...)
};
enum class Exchange {
  Ok,
  ConnectFailed,  // no connection (refused, unresolvable, connect timeout) or closed before any answer
  TlsFailed,      // the TLS handshake failed or a certificate was rejected (`error` says why)
  TimedOut,       // connected and sent, but no whole answer before the deadline
  Broken,         // a broken or unreadable answer
  Interrupted,    // a signal of Request::interrupt_on became pending (within about a second)
};

struct Request {
  std::string_view path;              // "/v3/kv/range"
  std::string_view body;              // JSON
  std::string_view token;             // etcd's auth token, sent as the Authorization header; empty: none
  Instant connect_deadline{};         // connecting (and a TLS handshake) must end by then
  Instant deadline{};                 // the whole exchange must end by then
  // A stream's answer never ends by itself: it is complete once `enough`
  // returns true for the body received so far. Null: the answer ends.
  std::function<bool(std::string_view body)> enough;
  bool fresh_connection = false;  // do not reuse a kept connection to this endpoint
  // A stream's answer ends by itself after this long (none: never): etcd's
  // gateway (gRPC-gateway) takes a Grpc-Timeout header as the call's
  // deadline and then ends the answer with an error frame, so that the
  // connection can carry the next request. (HTTP/1.1 has no other way to end
  // one request on a connection but to close it.)
  std::optional<Duration> server_timeout;
  // Signals that end the exchange early once pending, blocked or not (null:
  // only those that would end looplock, see etcd_curl.cpp).
  const sys::Interrupts* interrupt_on = nullptr;
};

// TLS for https:// endpoints: files in PEM; empty: the system's CAs, no
// client certificate.
struct Security {
  std::string cacert;
  std::string cert;
  std::string key;
};

class Transport {
public:
  virtual ~Transport() = default;
  virtual void configure(const Security&) {}
  // POSTs `req.body` to `ep.text + req.path`. `error` describes anything but Ok.
  virtual Exchange post(const Endpoint& ep, const Request& req, HttpResponse& out, std::string& error) = 0;
};

// The monotonic clock, and waiting on it.
class Clock {
public:
  virtual ~Clock() = default;
  virtual Instant now() = 0;
  // Returns at `until` (or earlier, when a signal interrupts the wait).
  virtual void sleep_until(Instant until) = 0;
};
Clock& system_clock();

// How long one call may take, and each of its attempts.
struct Deadline {
  Instant at{};                     // the call returns by then
  std::optional<Duration> attempt{};  // each attempt's timeout; none (or 0): until `at`
  // Double the attempt timeout each round (a write on a slow disk still gets
  // through); a keepalive, which etcd answers without a disk write, keeps it.
  bool grow = true;
  // A signal of this set pending ends the call at once: Status::Interrupted.
  const sys::Interrupts* interrupt_on = nullptr;
};

class Client {
public:
  // The first connect timeout: tens of milliseconds (a blackholed endpoint
  // costs that once), doubling each round up to kMaxConnect.
  static constexpr Duration kConnect = std::chrono::milliseconds(40);
  static constexpr Duration kMaxConnect = std::chrono::seconds(1);

  Client(Transport& transport, std::vector<Endpoint> endpoints, Clock& clock = system_clock());

  // etcd authentication: a token is asked for at the first call, sent with
  // every request, and asked for again when etcd says it is invalid.
  void set_credentials(std::string user, std::string password);

  Result<long long> lease_grant(int ttl_s, Deadline d);
  // The lease's TTL in seconds as etcd renewed it; 0 when etcd says the lease is gone.
  Result<long long> lease_keepalive(long long id, Deadline d);
  // Ok also when the lease was already gone.
  Result<bool> lease_revoke(long long id, Deadline d);
  Result<RangeResult> range(const RangeQuery& q, Deadline d);
  // Puts `value` at `key` under `lease` (0: none).
  Result<bool> put(std::string_view key, std::string_view value, long long lease, Deadline d);
  Result<TxnResult> txn(const std::string& body, Deadline d);
  // Waits until `key` is deleted (at or after `start_revision`) or etcd
  // ends the watch: true when whoever waits must read again (the key was
  // deleted, or etcd canceled the watch: compacted, permission denied, ...,
  // or ended the stream for any reason but its deadline); false when etcd
  // ended it at the deadline, as asked, with no news (Request::
  // server_timeout: the same watch can go on, and the connection stays
  // usable). Timeout when the deadline passed with the answer still open
  // (the connection is closed then).
  Result<bool> watch_delete(std::string_view key, long long start_revision, Deadline d,
                            std::string_view range_end = {});

  // The endpoint that answered last ("http://127.0.0.1:2379").
  const std::string& current_endpoint() const { return endpoints_[first_].text; }
  Clock& clock() { return clock_; }

private:
  struct CallSpec {
    std::string_view path;
    std::string body;
    Deadline deadline;
    bool timeout_ends = false;  // a timed-out attempt ends the call (a watch's wait), not retried
    std::function<bool(std::string_view)> enough;
    std::string* raw = nullptr;       // receives the whole body (a stream's lines)
    std::optional<Duration> server_timeout;  // Request::server_timeout
  };
  // A call of one answer (not a stream): retried on the next endpoint until
  // the deadline.
  static CallSpec unary(std::string_view path, std::string body, Deadline deadline) {
    CallSpec s;
    s.path = path;
    s.body = std::move(body);
    s.deadline = deadline;
    return s;
  }
  // What the attempts of one call found so far.
  struct CallProgress {
    std::vector<std::string> last_error;  // per endpoint
    bool reached = false;                 // some endpoint took the request (Timeout rather than Unavailable at the end)
    Cause cause = Cause::None;
    std::string cause_endpoint;
  };
  Result<Json> call(const CallSpec& spec);
  // Rounds over the endpoints until an answer, a failure, or the deadline.
  Result<Json> attempts(const CallSpec& spec, bool with_token);
  // One attempt on endpoint `i`: the call's result when it ends here, or
  // nullopt to go on to the next endpoint.
  std::optional<Result<Json>> attempt(const CallSpec& spec, bool with_token, size_t i, int round, CallProgress& p);
  Result<Json> gave_up(const CallProgress& p, Status status) const;
  // Asks for a token; false (with `failure` set) when etcd refuses.
  bool authenticate(const Deadline& d, Result<Json>& failure);

  Transport& transport_;
  std::vector<Endpoint> endpoints_;
  Clock& clock_;
  std::vector<Duration> connect_;      // per endpoint: the next connect timeout
  std::vector<bool> fresh_;            // per endpoint: its kept connection is suspect
  size_t first_ = 0;
  std::string user_, password_, token_;
  bool auth_disabled_ = false;  // etcd said authentication is not enabled
};

}  // namespace looplock::etcd
