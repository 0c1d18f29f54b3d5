#include "cluster/etcd.hpp"

#include <algorithm>
#include <charconv>
#include <ctime>

#include "base/text.hpp"
#include "os/sys.hpp"

namespace looplock::etcd {

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::optional<long long> parse_ll(std::string_view text) {
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16 | static_cast<unsigned char>(bytes[i + 1]) << 8 |
                 static_cast<unsigned char>(bytes[i + 2]);
    out += kB64[v >> 18 & 63];
    out += kB64[v >> 12 & 63];
    out += kB64[v >> 6 & 63];
    out += kB64[v & 63];
  }
  if (size_t rest = bytes.size() - i; rest > 0) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kB64[v >> 18 & 63];
    out += kB64[v >> 12 & 63];
    out += rest == 2 ? kB64[v >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() * 3 / 4);
  unsigned acc = 0;
  int bits = 0;
  for (char c : text) {
    int v = value(c);
    if (v < 0) return std::nullopt;
    acc = acc << 6 | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>(acc >> bits & 0xff);
    }
  }
  return out;
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string lock_key_name(std::string_view name) {
  if (name.find_first_of("/%") == std::string_view::npos) return std::string(name);
  std::string out;
  out.reserve(name.size() + 8);
  for (char c : name) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}
bool lock_name_encoded(std::string_view name) { return name.find_first_of("/%") != std::string_view::npos; }
std::string lock_service_name(std::string_view name) { return std::string(kKeyRoot) + lock_key_name(name) + "/lock"; }
std::string lock_prefix(std::string_view name) { return lock_service_name(name) + "/"; }
std::string legacy_lock_prefix(std::string_view name) { return std::string(kKeyRoot) + std::string(name) + "/lock/"; }
bool is_lock_key_name(std::string_view name) {
  if (name.find('/') != std::string_view::npos) return false;
  for (size_t at = name.find('%'); at != std::string_view::npos; at = name.find('%', at + 1)) {
    const std::string_view escape = name.substr(at, 3);
    if (escape != "%25" && escape != "%2F") return false;
  }
  return true;
}
std::vector<std::string> contender_prefixes(std::string_view name) {
  std::vector<std::string> out{lock_prefix(name)};
  // Not when the unencoded prefix is another name's encoded one: those keys are that name's.
  if (lock_name_encoded(name) && !is_lock_key_name(name)) out.push_back(legacy_lock_prefix(name));
  return out;
}
bool is_contender_key(std::string_view prefix, std::string_view key) {
  if (!key.starts_with(prefix) || key.size() == prefix.size()) return false;
  return key.find('/', prefix.size()) == std::string_view::npos;
}
std::string holder_key(std::string_view name) { return std::string(kKeyRoot) + std::string(name) + "/holder"; }
std::string runs_prefix(std::string_view name) { return std::string(kKeyRoot) + lock_key_name(name) + "/runs/"; }
std::string runs_key(std::string_view name, std::string_view operation) {
  return runs_prefix(name) + lock_key_name(operation);
}

std::string absorbed_root(std::string_view name) {
  return std::string(kKeyRoot) + lock_key_name(name) + "/absorbed/";
}
std::string absorbed_prefix(std::string_view name, long long waiter_lease) {
  return absorbed_root(name) + lease_hex(waiter_lease) + "/";
}
std::optional<long long> absorbed_waiter_lease(std::string_view root, std::string_view key) {
  if (!key.starts_with(root)) return std::nullopt;
  key.remove_prefix(root.size());
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos || slash + 1 == key.size() || key.find('/', slash + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return parse_lease_hex(key.substr(0, slash));
}

std::optional<long long> parse_lease_hex(std::string_view hex) {
  if (hex.empty() || hex.size() > 16) return std::nullopt;
  unsigned long long v = 0;
  for (char c : hex) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<unsigned>(d);
  }
  return static_cast<long long>(v);
}

std::string lease_hex(long long id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(id));
  return buf;
}

namespace {

Json range_json(const RangeQuery& q) {
  Json j{{"key", base64_encode(q.key)}};
  if (q.prefix) j["range_end"] = base64_encode(prefix_range_end(q.key));
  if (q.limit > 0) j["limit"] = std::to_string(q.limit);
  if (q.order != RangeQuery::Order::None) {
    j["sort_order"] = q.order == RangeQuery::Order::FirstCreated ? "ASCEND" : "DESCEND";
    j["sort_target"] = "CREATE";
  }
  if (q.max_create_revision > 0) j["max_create_revision"] = std::to_string(q.max_create_revision);
  return j;
}

Json put_json(std::string_view key, std::string_view value, long long lease) {
  Json j{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j;
}

// A txn compare on the create revision of `key` (or of every key under it).
Json create_revision_is(std::string_view key, long long revision, bool prefix = false) {
  Json j{{"key", base64_encode(key)},
         {"target", "CREATE"},
         {"result", "EQUAL"},
         {"create_revision", std::to_string(revision)}};
  if (prefix) j["range_end"] = base64_encode(prefix_range_end(key));
  return j;
}

Json first_created(std::string_view prefix, long long limit) {
  return Json{{"request_range", range_json({.key = std::string(prefix),
                                            .prefix = true,
                                            .limit = limit,
                                            .order = RangeQuery::Order::FirstCreated,
                                            .max_create_revision = 0})}};
}

}  // namespace

std::string lease_grant_body(int ttl_s) { return dump_json(Json{{"TTL", ttl_s}}); }
std::string lease_id_body(long long id) { return dump_json(Json{{"ID", std::to_string(id)}}); }
std::string range_body(const RangeQuery& q) { return dump_json(range_json(q)); }
std::string put_body(std::string_view key, std::string_view value, long long lease) {
  return dump_json(put_json(key, value, lease));
}
std::string authenticate_body(std::string_view user, std::string_view password) {
  return dump_json(Json{{"name", std::string(user)}, {"password", std::string(password)}});
}
std::string watch_delete_body(std::string_view key, long long start_revision, std::string_view range_end) {
  Json create{{"key", base64_encode(key)},
              {"start_revision", std::to_string(start_revision)},
              {"filters", Json::array({"NOPUT"})}};
  if (!range_end.empty()) create["range_end"] = base64_encode(range_end);
  return dump_json(Json{{"create_request", create}});
}

namespace {
Json puts(const std::vector<std::string>& keys, std::string_view value, long long lease) {
  Json ops = Json::array();
  for (const auto& k : keys) ops.push_back(Json{{"request_put", put_json(k, value, lease)}});
  return ops;
}
void add_reads(Json& ops, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) ops.push_back(first_created(p, 0));
}
}  // namespace

namespace {
// The read of `key` at the end of a transaction's operations, when asked for.
void add_read_also(Json& ops, std::string_view key) {
  if (!key.empty())
    ops.push_back(Json{{"request_range", range_json({.key = std::string(key),
                                                     .prefix = false,
                                                     .limit = 0,
                                                     .order = RangeQuery::Order::None,
                                                     .max_create_revision = 0})}});
}
}  // namespace

std::string queue_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                           const std::vector<std::string>& prefixes, std::string_view also_read) {
  Json success = puts(keys, value, lease);
  add_reads(success, prefixes);
  add_read_also(success, also_read);
  Json failure = Json::array({Json{{"request_range", range_json({.key = keys.at(0),
                                                                 .prefix = false,
                                                                 .limit = 0,
                                                                 .order = RangeQuery::Order::None,
                                                                 .max_create_revision = 0})}}});
  add_reads(failure, prefixes);
  add_read_also(failure, also_read);
  return dump_json(Json{{"compare", Json::array({create_revision_is(keys.at(0), 0)})},
                        {"success", std::move(success)},
                        {"failure", std::move(failure)}});
}

std::string create_if_free_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                                    const std::vector<std::string>& prefixes, std::string_view also_read) {
  Json compare = Json::array();
  for (const auto& p : prefixes) compare.push_back(create_revision_is(p, 0, true));
  Json success = puts(keys, value, lease);
  add_read_also(success, also_read);
  Json failure = Json::array();
  add_reads(failure, prefixes);
  add_read_also(failure, also_read);
  return dump_json(
      Json{{"compare", std::move(compare)}, {"success", std::move(success)}, {"failure", std::move(failure)}});
}

std::string guarded_put_txn_body(std::string_view guard_key, long long guard_create_revision, std::string_view key,
                                 long long mod_revision, std::string_view value) {
  Json mod{{"key", base64_encode(key)},
           {"target", "MOD"},
           {"result", "EQUAL"},
           {"mod_revision", std::to_string(mod_revision)}};
  return dump_json(Json{{"compare", Json::array({create_revision_is(guard_key, guard_create_revision), mod})},
                        {"success", Json::array({Json{{"request_put", put_json(key, value, 0)}}})}});
}

namespace {
Json delete_json(std::string_view key, bool prefix) {
  Json j{{"key", base64_encode(key)}};
  if (prefix) j["range_end"] = base64_encode(prefix_range_end(key));
  return Json{{"request_delete_range", std::move(j)}};
}
}  // namespace

std::string absorb_txn_body(const std::vector<std::pair<std::string, long long>>& guards,
                            const std::vector<std::string>& empty_prefixes, std::string_view key,
                            std::string_view value, const std::vector<std::string>& leave) {
  Json compare = Json::array();
  for (const auto& [k, revision] : guards) compare.push_back(create_revision_is(k, revision));
  for (const auto& p : empty_prefixes) compare.push_back(create_revision_is(p, 0, true));
  Json success = Json::array({Json{{"request_put", put_json(key, value, 0)}}});
  for (const auto& k : leave) success.push_back(delete_json(k, false));
  Json failure = Json::array();
  for (const auto& p : empty_prefixes) failure.push_back(Json{{"request_range", range_json({.key = p, .prefix = true})}});
  return dump_json(Json{{"compare", std::move(compare)}, {"success", std::move(success)}, {"failure", std::move(failure)}});
}

std::string reads_txn_body(const std::vector<std::string>& prefixes) {
  Json success = Json::array();
  add_reads(success, prefixes);
  return dump_json(Json{{"compare", Json::array()}, {"success", std::move(success)}});
}

std::string take_prefixes_txn_body(const std::vector<std::string>& prefixes, const std::vector<std::string>& keys) {
  Json success = Json::array();
  for (const auto& prefix : prefixes) {
    success.push_back(Json{{"request_range", range_json({.key = prefix, .prefix = true})}});
    success.push_back(delete_json(prefix, true));
  }
  for (const auto& k : keys) success.push_back(delete_json(k, false));
  return dump_json(Json{{"compare", Json::array()}, {"success", std::move(success)}});
}

std::string delete_prefixes_txn_body(const std::vector<std::string>& prefixes, const std::vector<std::string>& keys) {
  Json success = Json::array();
  for (const auto& prefix : prefixes) success.push_back(delete_json(prefix, true));
  for (const auto& k : keys) success.push_back(delete_json(k, false));
  return dump_json(Json{{"compare", Json::array()}, {"success", std::move(success)}});
}

std::string update_txn_body(const std::vector<std::string>& keys, std::string_view value, long long lease,
                            long long create_revision) {
  return dump_json(Json{{"compare", Json::array({create_revision_is(keys.at(0), create_revision)})},
                        {"success", puts(keys, value, lease)}});
}

std::vector<KeyValue> contenders(const std::vector<std::string>& prefixes, const std::vector<RangeResult>& ranges) {
  std::vector<KeyValue> out;
  for (size_t i = 0; i < prefixes.size() && i < ranges.size(); ++i) {
    for (const auto& kv : ranges[i].kvs) {
      if (!is_contender_key(prefixes[i], kv.key)) continue;
      const bool seen = std::any_of(out.begin(), out.end(),
                                    [&](const KeyValue& o) { return o.create_revision == kv.create_revision; });
      if (!seen) out.push_back(kv);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KeyValue& a, const KeyValue& b) { return a.create_revision < b.create_revision; });
  return out;
}

std::optional<Json> parse_answer(std::string_view body) {
  // A streaming answer holds one object per line: the first one counts.
  if (auto nl = body.find('\n'); nl != std::string_view::npos) {
    std::string_view rest = body.substr(nl);
    if (rest.find_first_not_of(" \r\n\t") != std::string_view::npos) body = body.substr(0, nl);
  }
  auto j = Json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  if (j.contains("result") && j["result"].is_object()) return j["result"];
  return j;
}

std::optional<long long> int64_field(const Json& j, const char* name) {
  if (!j.contains(name)) return 0;
  const Json& v = j[name];
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_string()) return parse_ll(v.get<std::string>());
  return std::nullopt;
}

std::optional<long long> parse_lease_grant(const Json& answer) {
  if (answer.contains("error") && answer["error"].is_string() && !answer["error"].get<std::string>().empty()) {
    return std::nullopt;
  }
  auto id = int64_field(answer, "ID");
  if (!id || *id == 0) return std::nullopt;
  return id;
}

long long parse_keepalive_ttl(const Json& answer) {
  auto ttl = int64_field(answer, "TTL");
  return ttl && *ttl > 0 ? *ttl : 0;
}

std::optional<std::vector<KeyValue>> parse_kvs(const Json& answer) {
  std::vector<KeyValue> out;
  if (!answer.contains("kvs")) return out;
  if (!answer["kvs"].is_array()) return std::nullopt;
  for (const auto& kv : answer["kvs"]) {
    if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string()) return std::nullopt;
    KeyValue v;
    auto key = base64_decode(kv["key"].get<std::string>());
    if (!key) return std::nullopt;
    v.key = std::move(*key);
    if (kv.contains("value")) {
      if (!kv["value"].is_string()) return std::nullopt;
      auto value = base64_decode(kv["value"].get<std::string>());
      if (!value) return std::nullopt;
      v.value = std::move(*value);
    }
    auto cr = int64_field(kv, "create_revision");
    auto mr = int64_field(kv, "mod_revision");
    auto lease = int64_field(kv, "lease");
    if (!cr || !mr || !lease) return std::nullopt;
    v.create_revision = *cr;
    v.mod_revision = *mr;
    v.lease = *lease;
    out.push_back(std::move(v));
  }
  return out;
}

namespace {
std::optional<long long> header_revision(const Json& answer) {
  if (!answer.contains("header")) return 0;
  if (!answer["header"].is_object()) return std::nullopt;
  return int64_field(answer["header"], "revision");
}
}  // namespace

std::optional<RangeResult> parse_range(const Json& answer) {
  RangeResult r;
  auto kvs = parse_kvs(answer);
  auto rev = header_revision(answer);
  auto count = int64_field(answer, "count");
  if (!kvs || !rev || !count) return std::nullopt;
  r.kvs = std::move(*kvs);
  r.revision = *rev;
  r.count = *count;
  return r;
}

std::optional<TxnResult> parse_txn(const Json& answer) {
  TxnResult t;
  auto rev = header_revision(answer);
  if (!rev) return std::nullopt;
  t.revision = *rev;
  if (answer.contains("succeeded")) {
    if (!answer["succeeded"].is_boolean()) return std::nullopt;
    t.succeeded = answer["succeeded"].get<bool>();
  }
  if (!answer.contains("responses")) return t;
  if (!answer["responses"].is_array()) return std::nullopt;
  for (const auto& op : answer["responses"]) {
    if (!op.is_object()) return std::nullopt;
    if (!op.contains("response_range")) continue;
    auto range = parse_range(op["response_range"]);
    if (!range) return std::nullopt;
    t.ranges.push_back(std::move(*range));
  }
  return t;
}

std::optional<std::string> parse_token(const Json& answer) {
  if (!answer.contains("token") || !answer["token"].is_string() || answer["token"].get<std::string>().empty()) {
    return std::nullopt;
  }
  return answer["token"].get<std::string>();
}

WatchProgress parse_watch(std::string_view body) {
  WatchProgress w;
  while (!body.empty()) {
    const size_t nl = body.find('\n');
    if (nl == std::string_view::npos) break;  // an incomplete last line: not yet
    std::string_view line = body.substr(0, nl);
    body.remove_prefix(nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
    auto j = Json::parse(line.begin(), line.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      w.malformed = true;
      return w;
    }
    if (j.contains("error")) {  // a stream's error frame: the stream has ended
      w.canceled = true;
      w.ended = true;
      if (j["error"].is_object()) {
        w.deadline = j["error"].value("grpc_code", 0) == grpc_code::kDeadlineExceeded ||
                     j["error"].value("message", std::string()).find("context deadline exceeded") != std::string::npos;
      }
      w.reason = j["error"].is_object() ? j["error"].value("message", std::string("error")) : "error";
      return w;
    }
    if (!j.contains("result") || !j["result"].is_object()) {
      w.malformed = true;
      return w;
    }
    const Json& r = j["result"];
    if (r.value("created", false)) w.created = true;
    if (r.value("canceled", false)) {
      w.canceled = true;
      w.reason = r.value("cancel_reason", std::string());
      if (w.reason.empty() && r.contains("compact_revision")) w.reason = "compacted";
    }
    if (r.contains("events") && r["events"].is_array()) {
      for (const auto& e : r["events"]) {
        if (e.is_object() && e.value("type", std::string()) == "DELETE") w.deleted = true;
      }
    }
  }
  return w;
}

std::string_view status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::Unavailable: return "unavailable";
    case Status::Timeout: return "timeout";
    case Status::Failed: return "failed";
    case Status::Interrupted: return "interrupted";
  }
  return "?";
}

namespace {

class SystemClock final : public Clock {
public:
  Instant now() override { return MonotonicClock::now(); }
  void sleep_until(Instant until) override {
    const Duration left = until - MonotonicClock::now();
    if (left <= Duration::zero()) return;
    nap(left);  // a signal ends it early: the caller looks at the clock again
  }
};

// The first and the largest pause between two rounds over the endpoints.
constexpr Duration kFirstPause = std::chrono::milliseconds(25);
constexpr Duration kMaxPause = std::chrono::milliseconds(400);
// Attempt timeouts double each round, up to this many times the first.
constexpr int kMaxAttemptDoublings = 3;
// A stream the server ends itself (Request::server_timeout) is asked to
// end this long before the attempt's deadline, so that its end arrives in
// time (a round trip and the server's own timer); with less room than the
// least timeout, the client's deadline ends it (and its connection).
constexpr Duration kStreamEndSlack = std::chrono::milliseconds(150);
constexpr Duration kMinServerTimeout = std::chrono::milliseconds(50);

std::string answer_message(const std::optional<Json>& answer, const std::string& body) {
  if (answer) {
    if (answer->contains("message") && (*answer)["message"].is_string()) return (*answer)["message"].get<std::string>();
    if (answer->contains("error") && (*answer)["error"].is_string()) return (*answer)["error"].get<std::string>();
    if (answer->contains("error") && (*answer)["error"].is_object()) {
      return (*answer)["error"].value("message", std::string("error"));
    }
  }
  return body.substr(0, 200);
}

int answer_code(const std::optional<Json>& answer) {
  if (!answer) return 0;
  if (answer->contains("code") && (*answer)["code"].is_number_integer()) return (*answer)["code"].get<int>();
  if (answer->contains("error") && (*answer)["error"].is_object() && (*answer)["error"].contains("grpc_code") &&
      (*answer)["error"]["grpc_code"].is_number_integer()) {
    return (*answer)["error"]["grpc_code"].get<int>();
  }
  return 0;
}

// An error a retry elsewhere (or a moment later) may not meet: no leader,
// leader changed, request timed out, too many requests, or a proxy's 502-504.
bool transient(int http_status, int code) {
  if (code == grpc_code::kUnavailable || code == grpc_code::kDeadlineExceeded || code == grpc_code::kResourceExhausted)
    return true;
  return code == 0 && (http_status == 502 || http_status == 503 || http_status == 504);
}

bool token_rejected(int code, const std::string& message) {
  return code == grpc_code::kUnauthenticated || message.find("revision of auth store is old") != std::string::npos;
}

}  // namespace

Clock& system_clock() {
  static SystemClock clock;
  return clock;
}

Client::Client(Transport& transport, std::vector<Endpoint> endpoints, Clock& clock)
    : transport_(transport),
      endpoints_(std::move(endpoints)),
      clock_(clock),
      connect_(endpoints_.size(), kConnect),
      fresh_(endpoints_.size(), false) {}

void Client::set_credentials(std::string user, std::string password) {
  user_ = std::move(user);
  password_ = std::move(password);
  token_.clear();
}

namespace {

// What an endpoint's answer says: an answer, something another member (or
// this one a moment later) may not say, or a failure that retrying will not
// mend.
struct Answer {
  enum class Kind { Ok, Retry, Failed } kind = Kind::Retry;
  Json value;
  std::string what;  // for messages, when not Ok
  int code = 0;      // etcd's gRPC code
  Cause cause = Cause::None;
};

Answer classify_answer(const HttpResponse& resp, const std::string& endpoint) {
  Answer a;
  auto answer = parse_answer(resp.body);
  const bool error_frame =
      answer && answer->contains("error") && !answer->contains("header") && (*answer)["error"].is_object();
  if (resp.status == 200 && answer && !error_frame) {
    a.kind = Answer::Kind::Ok;
    a.value = std::move(*answer);
    return a;
  }
  a.code = answer_code(answer);
  const std::string message = answer_message(answer, resp.body);
  a.what = endpoint + ": " + (resp.status != 200 ? "HTTP " + std::to_string(resp.status) + ": " : "") + message;
  // Unreadable but for a client error (4xx: the request is refused), or
  // transient: another member, or this one a moment later, may answer.
  const bool refused = resp.status >= 400 && resp.status < 500;
  if ((!answer && !refused) || transient(resp.status, a.code)) return a;
  a.kind = Answer::Kind::Failed;
  if (token_rejected(a.code, message)) a.code = grpc_code::kUnauthenticated;
  if (message.find("CommonName of client sending a request against gateway") != std::string::npos) {
    a.cause = Cause::CommonNameRefused;
  } else if (a.code == grpc_code::kPermissionDenied) {
    a.cause = Cause::PermissionDenied;
  } else if (message.find("user name is empty") != std::string::npos ||
             (a.code == grpc_code::kInvalidArgument && message.find("authentication failed") != std::string::npos)) {
    a.cause = Cause::BadCredentials;
  }
  return a;
}

}  // namespace

Result<Json> Client::gave_up(const CallProgress& p, Status status) const {
  Result<Json> r;
  r.status = status;
  std::string errors;
  for (const auto& e : p.last_error) {
    if (!e.empty() && errors.find(e) == std::string::npos) errors += (errors.empty() ? "" : "; ") + e;
  }
  r.error = errors.empty() ? (endpoints_.empty() ? "no endpoint" : "deadline passed") : errors;
  r.cause = p.cause;
  r.cause_endpoint = p.cause_endpoint;
  return r;
}

std::optional<Result<Json>> Client::attempt(const CallSpec& spec, bool with_token, size_t i, int round,
                                            CallProgress& p) {
  const Instant begin = clock_.now();
  const Instant deadline = spec.deadline.at;
  if (begin >= deadline) return gave_up(p, p.reached ? Status::Timeout : Status::Unavailable);
  Instant attempt_deadline = deadline;
  if (spec.deadline.attempt && *spec.deadline.attempt > Duration::zero()) {
    const int doublings = spec.deadline.grow ? std::min(round, kMaxAttemptDoublings) : 0;
    attempt_deadline = std::min(deadline, later(begin, *spec.deadline.attempt * (1 << doublings)));
  }
  Request req;
  req.path = spec.path;
  req.body = spec.body;
  if (with_token) req.token = token_;
  req.connect_deadline = std::min(attempt_deadline, begin + connect_[i]);
  req.deadline = attempt_deadline;
  req.enough = spec.enough;
  req.fresh_connection = fresh_[i];
  // The server ends the stream in time for this attempt to read its end.
  if (spec.server_timeout && *spec.server_timeout > Duration::zero()) {
    const Duration room = attempt_deadline - begin - kStreamEndSlack;
    if (room >= kMinServerTimeout) req.server_timeout = std::min(*spec.server_timeout, room);
  }
  req.interrupt_on = spec.deadline.interrupt_on;
  HttpResponse resp;
  std::string error;
  const Exchange ex = transport_.post(endpoints_[i], req, resp, error);
  if (resp.cause != Cause::None) {
    p.cause = resp.cause;
    p.cause_endpoint = endpoints_[i].text;
  }
  Result<Json> r;
  switch (ex) {
    case Exchange::Interrupted:
      fresh_[i] = true;  // cut mid-request: that connection is not to be reused
      r.status = Status::Interrupted;
      r.error = error;
      return r;
    case Exchange::ConnectFailed:
    case Exchange::TlsFailed:
      // A connect that ran out its timeout: give this endpoint longer next time.
      if (ex == Exchange::ConnectFailed && clock_.now() >= req.connect_deadline) {
        connect_[i] = std::min(connect_[i] * 2, kMaxConnect);
      }
      // A TLS failure says more than a later timeout on the same endpoint.
      if (ex == Exchange::TlsFailed || p.last_error[i].find(": TLS: ") == std::string::npos) p.last_error[i] = error;
      return std::nullopt;
    case Exchange::TimedOut:
    case Exchange::Broken:
      p.reached = true;
      fresh_[i] = true;  // a kept connection to a member that went silent must not be reused
      p.last_error[i] = error;
      if (ex == Exchange::TimedOut && spec.timeout_ends) {
        first_ = i;
        r.status = Status::Timeout;
        r.error = error;
        return r;
      }
      return std::nullopt;
    case Exchange::Ok: break;
  }
  fresh_[i] = false;
  p.reached = true;
  if (spec.raw) *spec.raw = resp.body;
  Answer a = classify_answer(resp, endpoints_[i].text);
  if (a.kind == Answer::Kind::Retry) {
    p.last_error[i] = a.what;
    return std::nullopt;
  }
  first_ = i;
  if (a.kind == Answer::Kind::Ok) {
    r.status = Status::Ok;
    r.value = std::move(a.value);
    r.sent = begin;
    return r;
  }
  r.status = Status::Failed;
  r.code = a.code;
  r.error = a.what;
  r.cause = a.cause;
  r.cause_endpoint = endpoints_[i].text;
  return r;
}

Result<Json> Client::attempts(const CallSpec& spec, bool with_token) {
  CallProgress p;
  p.last_error.resize(endpoints_.size());
  if (endpoints_.empty()) return gave_up(p, Status::Unavailable);
  const Instant deadline = spec.deadline.at;
  // Pauses stay short beside the attempts (a lease's renewal has little time).
  const Duration max_pause = spec.deadline.attempt && *spec.deadline.attempt > Duration::zero()
                                 ? std::min(kMaxPause, *spec.deadline.attempt / 4)
                                 : kMaxPause;
  Duration pause = std::min(kFirstPause, max_pause);
  for (int round = 0;; ++round) {
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      if (auto r = attempt(spec, with_token, (first_ + k) % endpoints_.size(), round, p)) return std::move(*r);
    }
    const Instant now = clock_.now();
    if (now >= deadline) return gave_up(p, p.reached ? Status::Timeout : Status::Unavailable);
    clock_.sleep_until(std::min(deadline, now + pause));
    pause = std::min(pause * 2, max_pause);
  }
}

bool Client::authenticate(const Deadline& d, Result<Json>& failure) {
  const CallSpec spec =
      unary("/v3/auth/authenticate", authenticate_body(user_, password_), {.at = d.at, .attempt = d.attempt});
  Result<Json> r = attempts(spec, false);
  if (r.ok()) {
    auto token = parse_token(r.value);
    if (!token) {
      failure.status = Status::Failed;
      failure.error = "etcd gave no token for user " + printable(user_);
      return false;
    }
    token_ = std::move(*token);
    return true;
  }
  if (r.status == Status::Failed && r.code == grpc_code::kFailedPrecondition &&
      r.error.find("authentication is not enabled") != std::string::npos) {
    auth_disabled_ = true;  // nothing to log in to: requests go without a token
    return true;
  }
  failure = std::move(r);
  failure.error = "cannot log in as etcd user " + printable(user_) + ": " + failure.error;
  if (failure.status == Status::Failed) {
    if (failure.cause == Cause::None) failure.cause = Cause::BadCredentials;
  }
  return false;
}

Result<Json> Client::call(const CallSpec& spec) {
  const bool auth = !user_.empty() && !auth_disabled_;
  if (auth && token_.empty()) {
    Result<Json> failure;
    if (!authenticate(spec.deadline, failure)) return failure;
  }
  Result<Json> r = attempts(spec, auth && !auth_disabled_);
  if (auth && !auth_disabled_ && r.status == Status::Failed && r.code == grpc_code::kUnauthenticated) {
    // The token expired (or the member restarted and forgot it): once more with a new one.
    token_.clear();
    Result<Json> failure;
    if (!authenticate(spec.deadline, failure)) return failure;
    r = attempts(spec, true);
  }
  return r;
}

namespace {
// A call's outcome carried over to a typed result, its value still to be
// read from the answer: status, error, cause, code, and when it was sent.
template <typename T>
Result<T> carried(const Result<Json>& answer) {
  Result<T> r;
  r.status = answer.status;
  r.error = answer.error;
  r.cause = answer.cause;
  r.cause_endpoint = answer.cause_endpoint;
  r.code = answer.code;
  r.sent = answer.sent;
  return r;
}

// A call's answer as a typed result: `parse` gives the value (nullopt: the
// answer is malformed); a failed call's status, error and cause carry over.
template <typename T, typename Parse>
Result<T> interpret(const Result<Json>& answer, const char* what, Parse parse) {
  Result<T> r = carried<T>(answer);
  if (!answer.ok()) return r;
  std::optional<T> value = parse(answer.value);
  if (!value) {
    r.status = Status::Failed;
    r.error = std::string("unexpected answer to ") + what + ": " + dump_json(answer.value).substr(0, 200);
    return r;
  }
  r.value = std::move(*value);
  return r;
}

std::optional<bool> any_answer(const Json&) { return true; }
std::optional<long long> keepalive_ttl(const Json& answer) { return parse_keepalive_ttl(answer); }

}  // namespace

Result<long long> Client::lease_grant(int ttl_s, Deadline d) {
  return interpret<long long>(call(unary("/v3/lease/grant", lease_grant_body(ttl_s), d)), "lease grant",
                              parse_lease_grant);
}

Result<long long> Client::lease_keepalive(long long id, Deadline d) {
  return interpret<long long>(call(unary("/v3/lease/keepalive", lease_id_body(id), d)), "keepalive", keepalive_ttl);
}

Result<bool> Client::lease_revoke(long long id, Deadline d) {
  auto r = interpret<bool>(call(unary("/v3/lease/revoke", lease_id_body(id), d)), "revoke", any_answer);
  if (r.status == Status::Failed && r.code == grpc_code::kNotFound) {
    r.status = Status::Ok;  // gone already: what a revoke wants
    r.value = false;
  }
  return r;
}

Result<RangeResult> Client::range(const RangeQuery& q, Deadline d) {
  return interpret<RangeResult>(call(unary("/v3/kv/range", range_body(q), d)), "range", parse_range);
}

Result<bool> Client::put(std::string_view key, std::string_view value, long long lease, Deadline d) {
  return interpret<bool>(call(unary("/v3/kv/put", put_body(key, value, lease), d)), "put",
                         [](const Json&) { return std::optional<bool>(true); });
}

Result<TxnResult> Client::txn(const std::string& body, Deadline d) {
  return interpret<TxnResult>(call(unary("/v3/kv/txn", body, d)), "txn", parse_txn);
}

Result<bool> Client::watch_delete(std::string_view key, long long start_revision, Deadline d,
                                  std::string_view range_end) {
  std::string raw;
  // Read until the news, or until etcd ends the stream itself (its
  // Grpc-Timeout): then the answer is complete and the connection is kept.
  auto enough = [](std::string_view body) {
    const WatchProgress w = parse_watch(body);
    return w.deleted || (w.canceled && !w.ended) || w.malformed;
  };
  const CallSpec spec{.path = "/v3/watch",
                      .body = watch_delete_body(key, start_revision, range_end),
                      .deadline = d,
                      .timeout_ends = true,
                      .enough = enough,
                      .raw = &raw,
                      .server_timeout = d.at - clock_.now()};
  Result<Json> answer = call(spec);
  Result<bool> r = carried<bool>(answer);
  if (!answer.ok()) return r;
  WatchProgress w = parse_watch(raw);
  // Nothing decided on a whole line: the stream ended by itself, and its
  // last line (etcd's error frame, which no newline follows) is whole too.
  if (!w.deleted && !w.canceled && !w.malformed && !raw.empty() && raw.back() != '\n') w = parse_watch(raw + "\n");
  if (w.malformed) {
    r.status = Status::Failed;
    r.error = "unexpected answer to watch: " + raw.substr(0, 200);
    return r;
  }
  // Read again after the news, after a canceled watch (its revision was
  // compacted, ...), and after a stream etcd ended for another reason than
  // the deadline it was given; the same watch again after that deadline.
  r.value = w.deleted || (w.canceled && !(w.ended && w.deadline));
  return r;
}

}  // namespace looplock::etcd
