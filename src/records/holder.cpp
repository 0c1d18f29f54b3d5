#include "records/holder.hpp"

#include <algorithm>
#include <ctime>

#include "os/clock.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"
#include "records/sealed.hpp"

namespace looplock {

namespace {
constexpr size_t kReadLimit = 64 * 1024;

std::optional<HoldFacts> hold_from_json(const Json& h) {
  if (!h.is_object()) return std::nullopt;
  for (const char* k : {"tied_to_start", "ends_at", "secret_sha256"}) {
    if (!h.contains(k) || !h[k].is_string()) return std::nullopt;
  }
  if (!h.contains("tied_to")) return std::nullopt;
  const Json& tie = h["tied_to"];
  if (!tie.is_null() && !(tie.is_number_integer() && tie.get<long long>() > 0 && tie.get<long long>() <= 0x7fffffff))
    return std::nullopt;
  return HoldFacts{.tied_to = tie.is_null() ? 0 : static_cast<Pid>(tie.get<long long>()),
                   .tied_start = h["tied_to_start"].get<std::string>(),
                   .ends_at = h["ends_at"].get<std::string>(),
                   .secret_sha256 = h["secret_sha256"].get<std::string>()};
}
}  // namespace

std::string clip_bytes(std::string s, size_t max) {
  if (s.size() <= max) return s;
  // Never inside a character: back to the start of the one that would not fit.
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80 && max - cut < 3) --cut;
  if ((static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) cut = max;  // not UTF-8 there anyway
  s.resize(cut);
  return s;
}

Json holder_to_json(const HolderRecord& r) {
  Json j = Json::object();
  j["schema"] = kHolderSchema;
  j["lock_id"] = r.lock_id;
  j["pid"] = r.pid;
  j["pid_start"] = r.pid_start;
  j["agent_id"] = clip_bytes(r.agent_id);
  j["operation"] = clip_bytes(r.operation);
  j["policy"] = r.policy;
  j["acquired_at"] = r.acquired_at;
  j["released_at"] = r.released_at ? Json(*r.released_at) : Json(nullptr);
  if (r.no_fork) j["no_fork"] = true;
  if (r.holders > 0) {
    j["holders"] = r.holders;
    j["index"] = r.index;
  }
  if (r.hold) {
    j["hold"] = {{"tied_to", r.hold->tied_to != 0 ? Json(r.hold->tied_to) : Json(nullptr)},
                 {"tied_to_start", r.hold->tied_start},
                 {"ends_at", r.hold->ends_at},
                 {"secret_sha256", r.hold->secret_sha256}};
  }
  return j;
}

std::optional<HolderRecord> holder_from_json(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string(); };
  if (!str("schema") || j["schema"] != kHolderSchema) return std::nullopt;
  if (!str("lock_id") || !str("pid_start") || !str("agent_id") || !str("operation") || !str("policy") ||
      !str("acquired_at"))
    return std::nullopt;
  if (!j.contains("pid") || !j["pid"].is_number_integer()) return std::nullopt;
  if (!j.contains("released_at") || !(j["released_at"].is_null() || j["released_at"].is_string())) return std::nullopt;
  if (j.contains("no_fork") && !j["no_fork"].is_boolean()) return std::nullopt;
  for (const char* k : {"holders", "index"}) {
    if (j.contains(k) && !(j[k].is_number_integer() && j[k].get<long long>() >= 0 && j[k].get<long long>() <= 1 << 20))
      return std::nullopt;
  }
  long long pid = j["pid"].get<long long>();
  if (pid <= 0 || pid > 0x7fffffff) return std::nullopt;
  HolderRecord r;
  r.lock_id = j["lock_id"].get<std::string>();
  r.pid = static_cast<Pid>(pid);
  r.pid_start = j["pid_start"].get<std::string>();
  r.agent_id = j["agent_id"].get<std::string>();
  r.operation = j["operation"].get<std::string>();
  r.policy = j["policy"].get<std::string>();
  r.acquired_at = j["acquired_at"].get<std::string>();
  if (j["released_at"].is_string()) r.released_at = j["released_at"].get<std::string>();
  r.no_fork = j.value("no_fork", false);
  r.holders = j.value("holders", 0);
  r.index = j.value("index", 0);
  if (j.contains("hold")) {
    r.hold = hold_from_json(j["hold"]);
    if (!r.hold) return std::nullopt;
  }
  return r;
}

namespace {
// Beyond this size a lock file holds something else (garbage): the record
// then cuts it off rather than padding over it.
constexpr long long kMaxPaddedSize = 4096;
}  // namespace

std::string holder_check(std::string_view body) { return check_of(body); }

namespace {
// One JSON string, escaped by nlohmann-json (invalid UTF-8 becomes U+FFFD);
// one of printable ASCII but for '"' and '\\' (what the record's values
// nearly always are) needs no escaping, and nlohmann-json would write it as
// it is: it is appended without building a JSON value.
void append_json_string(std::string& out, const std::string& s) {
  const bool plain =
      std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  if (!plain) {
    out += dump_json(Json(s));
    return;
  }
  out += '"';
  out += s;
  out += '"';
}
}  // namespace

std::string encode_holder(const HolderRecord& r) {
  // The same text as dump_json(holder_to_json(r)) (a unit test holds them
  // equal), put together field by field: this runs twice per run on the
  // critical section (taking and releasing), and building an ordered JSON
  // object costs several times as much.
  std::string body = "{\"schema\":";
  append_json_string(body, std::string(kHolderSchema));
  body += ",\"lock_id\":";
  append_json_string(body, r.lock_id);
  body += ",\"pid\":" + std::to_string(r.pid) + ",\"pid_start\":";
  append_json_string(body, r.pid_start);
  body += ",\"agent_id\":";
  append_json_string(body, clip_bytes(r.agent_id));
  body += ",\"operation\":";
  append_json_string(body, clip_bytes(r.operation));
  body += ",\"policy\":";
  append_json_string(body, r.policy);
  body += ",\"acquired_at\":";
  append_json_string(body, r.acquired_at);
  body += ",\"released_at\":";
  if (r.released_at) {
    append_json_string(body, *r.released_at);
  } else {
    body += "null";
  }
  if (r.no_fork) body += ",\"no_fork\":true";
  if (r.holders > 0) body += ",\"holders\":" + std::to_string(r.holders) + ",\"index\":" + std::to_string(r.index);
  if (r.hold) {
    body += ",\"hold\":{\"tied_to\":" + (r.hold->tied_to != 0 ? std::to_string(r.hold->tied_to) : "null") +
            ",\"tied_to_start\":";
    append_json_string(body, r.hold->tied_start);
    body += ",\"ends_at\":";
    append_json_string(body, r.hold->ends_at);
    body += ",\"secret_sha256\":";
    append_json_string(body, r.hold->secret_sha256);
    body += "}";
  }
  // "check" goes last, over everything before it.
  return seal(body);
}

std::optional<HolderRecord> parse_holder(std::string_view content) {
  // A record with a check must match it: a read that overlapped a rewrite
  // mixes two records and fails here. (Records without one, from other
  // tools, are taken as they are.)
  const std::optional<Unsealed> object = unseal(content);
  if (!object) return std::nullopt;
  auto j = Json::parse(object->object.begin(), object->object.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return holder_from_json(j);
}

bool write_holder(int fd, const HolderRecord& r) {
  // Written over the previous content, padded to at least its length, so
  // that the file never has to shrink (sealed.hpp).
  return write_over(fd, encode_holder(r), kMaxPaddedSize);
}

HolderRead read_holder(int fd) {
  HolderRead out;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) {
      nap(std::chrono::milliseconds(2));
    }
    auto content = sys::pread_all(fd, kReadLimit);
    if (!content) {
      out.state = HolderRead::State::Error;
      out.err = errno;
      return out;
    }
    out.size = content->size();
    if (content->empty()) {
      out.state = HolderRead::State::Empty;
      return out;
    }
    if (auto r = parse_holder(*content)) {
      out.state = HolderRead::State::Valid;
      out.record = std::move(r);
      return out;
    }
    out.state = HolderRead::State::Unreadable;
  }
  return out;
}

}  // namespace looplock
