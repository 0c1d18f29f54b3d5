#include "etcd.hpp"

#include <algorithm>
#include <charconv>

#include "sys.hpp"

namespace looplock::etcd {

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::optional<int> parse_port(std::string_view text) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v < 1 || v > 65535) return std::nullopt;
  return v;
}

std::optional<long long> parse_ll(std::string_view text) {
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

ParsedEndpoints parse_endpoints(std::string_view text) {
  ParsedEndpoints out;
  auto fail = [&](std::string why) {
    out.endpoints.clear();
    out.error = std::move(why);
    return out;
  };
  if (text.empty()) return fail("no endpoint");
  size_t start = 0;
  for (;;) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::string shown(item);
    if (item.starts_with("https://")) return fail("'" + shown + "': https is not supported; use http://");
    if (!item.starts_with("http://")) return fail("'" + shown + "' does not start with http://");
    item.remove_prefix(7);
    if (item.ends_with('/')) item.remove_suffix(1);
    Endpoint e;
    e.text = "http://" + std::string(item);
    size_t colon;
    if (item.starts_with('[')) {
      size_t close = item.find(']');
      if (close == std::string_view::npos || close + 1 >= item.size() || item[close + 1] != ':') {
        return fail("'" + shown + "': expected http://[IPV6]:PORT");
      }
      e.host = std::string(item.substr(1, close - 1));
      colon = close + 1;
    } else {
      colon = item.rfind(':');
      if (colon == std::string_view::npos) return fail("'" + shown + "' has no :PORT");
      e.host = std::string(item.substr(0, colon));
    }
    auto port = parse_port(item.substr(colon + 1));
    if (!port) return fail("'" + shown + "' has no valid port (1-65535)");
    e.port = *port;
    if (e.host.empty() || e.host.find_first_of("/?#@ \t") != std::string::npos) {
      return fail("'" + shown + "' has no valid host");
    }
    out.endpoints.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

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

std::string lock_service_name(std::string_view name) { return std::string(kKeyRoot) + std::string(name) + "/lock"; }
std::string holder_key(std::string_view name) { return std::string(kKeyRoot) + std::string(name) + "/holder"; }

std::string lease_hex(long long id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(id));
  return buf;
}

std::string lease_grant_body(int ttl_s) { return dump_json(Json{{"TTL", ttl_s}}); }
std::string lease_id_body(long long id) { return dump_json(Json{{"ID", std::to_string(id)}}); }
std::string lock_body(std::string_view name, long long lease) {
  return dump_json(Json{{"name", base64_encode(name)}, {"lease", std::to_string(lease)}});
}
std::string unlock_body(std::string_view key) { return dump_json(Json{{"key", base64_encode(key)}}); }
std::string range_body(std::string_view key, bool prefix) {
  Json j{{"key", base64_encode(key)}};
  if (prefix) j["range_end"] = base64_encode(prefix_range_end(key));
  return dump_json(j);
}
std::string put_body(std::string_view key, std::string_view value, long long lease) {
  Json j{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return dump_json(j);
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

std::optional<std::string> parse_lock_key(const Json& answer) {
  if (!answer.contains("key") || !answer["key"].is_string()) return std::nullopt;
  auto key = base64_decode(answer["key"].get<std::string>());
  if (!key || key->empty()) return std::nullopt;
  return key;
}

std::optional<std::vector<KeyValue>> parse_range(const Json& answer) {
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

std::string_view status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::Unavailable: return "unavailable";
    case Status::Timeout: return "timeout";
    case Status::Failed: return "failed";
  }
  return "?";
}

Result<Json> Client::call(std::string_view path, const std::string& body, long long deadline_ns) {
  Result<Json> r;
  const bool stream = path == "/v3/lease/keepalive";
  std::string errors;
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (first_ + k) % endpoints_.size();
    if (sys::monotonic_ns() >= deadline_ns) {
      r.status = errors.empty() ? Status::Timeout : Status::Unavailable;
      r.error = errors.empty() ? "deadline passed" : errors;
      return r;
    }
    HttpResponse resp;
    std::string error;
    const long long connect_deadline = std::min(deadline_ns, sys::monotonic_ns() + connect_timeout_ns_);
    Exchange ex = transport_.post(endpoints_[i], path, body, connect_deadline, deadline_ns, stream, resp, error);
    if (ex == Exchange::ConnectFailed) {
      errors += (errors.empty() ? "" : "; ") + error;
      continue;
    }
    first_ = i;
    if (ex == Exchange::TimedOut) {
      r.status = Status::Timeout;
      r.error = error;
      return r;
    }
    if (ex == Exchange::Broken) {
      r.status = Status::Failed;
      r.error = error;
      return r;
    }
    auto answer = parse_answer(resp.body);
    if (resp.status != 200 || !answer) {
      r.status = Status::Failed;
      std::string what = answer && answer->contains("message") && (*answer)["message"].is_string()
                             ? (*answer)["message"].get<std::string>()
                         : answer && answer->contains("error") && (*answer)["error"].is_string()
                             ? (*answer)["error"].get<std::string>()
                             : resp.body.substr(0, 200);
      r.error = endpoints_[i].text + ": HTTP " + std::to_string(resp.status) + ": " + what;
      return r;
    }
    if (answer->contains("error") && answer->at("error").is_object()) {  // a stream's error frame
      r.status = Status::Failed;
      r.error = endpoints_[i].text + ": " + answer->at("error").value("message", std::string("error"));
      return r;
    }
    r.status = Status::Ok;
    r.value = std::move(*answer);
    return r;
  }
  r.status = Status::Unavailable;
  r.error = errors.empty() ? "no endpoint" : errors;
  return r;
}

namespace {
// A call's answer as a typed result: `parse` gives the value (nullopt: the
// answer is malformed); a failed call's status and error carry over.
template <typename T, typename Parse>
Result<T> interpret(const Result<Json>& answer, const char* what, Parse parse) {
  Result<T> r;
  r.status = answer.status;
  r.error = answer.error;
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

Result<long long> Client::lease_grant(int ttl_s, long long deadline_ns) {
  return interpret<long long>(call("/v3/lease/grant", lease_grant_body(ttl_s), deadline_ns), "lease grant",
                              parse_lease_grant);
}

Result<long long> Client::lease_keepalive(long long id, long long deadline_ns) {
  return interpret<long long>(call("/v3/lease/keepalive", lease_id_body(id), deadline_ns), "keepalive",
                              keepalive_ttl);
}

Result<bool> Client::lease_revoke(long long id, long long deadline_ns) {
  return interpret<bool>(call("/v3/lease/revoke", lease_id_body(id), deadline_ns), "revoke", any_answer);
}

Result<std::string> Client::lock(std::string_view name, long long lease, long long deadline_ns) {
  return interpret<std::string>(call("/v3/lock/lock", lock_body(name, lease), deadline_ns), "lock", parse_lock_key);
}

Result<bool> Client::unlock(std::string_view key, long long deadline_ns) {
  return interpret<bool>(call("/v3/lock/unlock", unlock_body(key), deadline_ns), "unlock", any_answer);
}

Result<std::vector<KeyValue>> Client::range(std::string_view key, bool prefix, long long deadline_ns) {
  return interpret<std::vector<KeyValue>>(call("/v3/kv/range", range_body(key, prefix), deadline_ns), "range",
                                          parse_range);
}

Result<bool> Client::put(std::string_view key, std::string_view value, long long lease, long long deadline_ns) {
  return interpret<bool>(call("/v3/kv/put", put_body(key, value, lease), deadline_ns), "put", any_answer);
}

}  // namespace looplock::etcd
