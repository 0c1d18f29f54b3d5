#include "records/run_entry.hpp"

#include <algorithm>

#include "base/text.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/holder.hpp"
#include "records/sealed.hpp"

namespace looplock {

namespace {

// Whether a name is stored as it is: valid UTF-8 of at most 256 bytes.
bool stored_as_is(const std::string& name) { return name.size() <= kMaxIdentityBytes && valid_utf8(name); }

}  // namespace

Json run_entry_to_json(const RunEntry& e) {
  Json j = Json::object();
  // A name that is not valid UTF-8 (or too long) is shown with U+FFFD, and
  // stored whole beside it, in hex.
  j["operation"] = clip_bytes(e.operation);
  if (!stored_as_is(e.operation)) j["operation_bytes"] = hex_encode(e.operation);
  j["host"] = clip_bytes(e.host);
  j["pid"] = e.pid;
  j["agent_id"] = clip_bytes(e.agent);
  j["started_at"] = sys::utc_iso8601(e.started_ms);
  j["started_ms"] = e.started_ms;
  j["ended_at"] = e.ended_ms ? Json(sys::utc_iso8601(*e.ended_ms)) : Json(nullptr);
  j["ended_ms"] = e.ended_ms ? Json(*e.ended_ms) : Json(nullptr);
  j["exit_status"] = e.exit_status ? Json(*e.exit_status) : Json(nullptr);
  if (e.fencing_token != 0) j["fencing_token"] = e.fencing_token;
  if (e.once_per_ms) j["once_per_ms"] = *e.once_per_ms;
  if (!e.pid_start.empty()) j["pid_start"] = e.pid_start;
  if (!e.boot_id.empty()) j["boot_id"] = e.boot_id;
  if (!e.pid_ns.empty()) j["pid_ns"] = e.pid_ns;
  return j;
}

std::optional<RunEntry> run_entry_from_json(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string(); };
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number_integer(); };
  auto num_or_null = [&](const char* k) { return j.contains(k) && (j[k].is_null() || j[k].is_number_integer()); };
  if (!str("operation") || !str("host") || !num("pid") || !str("agent_id") || !num("started_ms")) return std::nullopt;
  if (!num_or_null("ended_ms") || !num_or_null("exit_status")) return std::nullopt;
  if (j.contains("fencing_token") && !num("fencing_token")) return std::nullopt;
  if (j.contains("once_per_ms") && !num("once_per_ms")) return std::nullopt;
  for (const char* k : {"operation_bytes", "pid_start", "boot_id", "pid_ns"}) {
    if (j.contains(k) && !str(k)) return std::nullopt;
  }
  RunEntry e;
  e.operation = j["operation"].get<std::string>();
  if (j.contains("operation_bytes")) {
    auto raw = hex_decode(j["operation_bytes"].get<std::string>());
    if (!raw) return std::nullopt;
    e.operation = std::move(*raw);
  }
  e.host = j["host"].get<std::string>();
  e.pid = j["pid"].get<long long>();
  e.agent = j["agent_id"].get<std::string>();
  e.started_ms = j["started_ms"].get<long long>();
  if (j["ended_ms"].is_number_integer()) e.ended_ms = j["ended_ms"].get<long long>();
  if (j["exit_status"].is_number_integer()) e.exit_status = j["exit_status"].get<int>();
  if (j.contains("fencing_token")) e.fencing_token = j["fencing_token"].get<long long>();
  if (j.contains("once_per_ms")) e.once_per_ms = j["once_per_ms"].get<long long>();
  e.pid_start = j.value("pid_start", std::string());
  e.boot_id = j.value("boot_id", std::string());
  e.pid_ns = j.value("pid_ns", std::string());
  if (e.pid <= 0 || e.started_ms <= 0) return std::nullopt;
  return e;
}

std::optional<RunEntry> parse_run_entry(std::string_view text) {
  const Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  return j.is_discarded() ? std::nullopt : run_entry_from_json(j);
}

std::string describe_run(const RunEntry& e) {
  std::string out = "host " + e.host + " pid " + std::to_string(e.pid) + " (agent " + e.agent + "), which started at " +
                    sys::utc_iso8601(e.started_ms);
  if (e.ended_ms) {
    out += " and ended at " + sys::utc_iso8601(*e.ended_ms);
    if (e.exit_status) out += " with status " + std::to_string(*e.exit_status);
  } else {
    out += " and has not recorded its end";
  }
  return out;
}

bool run_covers(const RunEntry& e, long long started_ms) {
  return e.ended_ms && (e.started_ms >= started_ms || (e.once_per_ms && started_ms < e.started_ms + *e.once_per_ms));
}

bool runner_proven_dead(const RunEntry& e) { return sys::proven_dead(e.boot_id, e.pid_ns, e.pid, e.pid_start); }

bool runner_alive_here(const RunEntry& e) {
  if (e.boot_id.empty() || e.pid_start.empty() || e.pid <= 0 || e.pid > 0x7fffffff) return false;
  const auto pid = static_cast<Pid>(e.pid);
  return e.boot_id == sys::boot_id() && e.pid_ns == sys::pid_namespace() && sys::process_alive(pid) &&
         sys::process_start(pid) == e.pid_start;  // a zombie, KILLed and not yet reaped, is no runner
}

SlotVerdict judge_slot(const std::optional<RunEntry>& entry, long long now_ms, long long once_per_ms) {
  if (!entry) return {};
  const long long since = now_ms - entry->started_ms;
  if (since >= once_per_ms) return {};
  if (since < -once_per_ms) return {Slot::Damaged, -since};
  const long long ahead = since < 0 ? -since : 0;
  return {entry->ended_ms ? Slot::Done : Slot::Running, ahead};
}

LedgerUpdate with_entry(std::vector<RunEntry> entries, const RunEntry& entry, long long now_ms) {
  std::erase_if(entries, [&](const RunEntry& e) { return e.operation == entry.operation; });
  entries.push_back(entry);
  // Past the limit, the oldest whose slot is over (or unknown: an earlier
  // version's entry) go first.
  const auto in_slot = [&](const RunEntry& e) { return e.once_per_ms && now_ms - e.started_ms < *e.once_per_ms; };
  LedgerUpdate u;
  for (auto it = entries.begin(); entries.size() > kMaxLedgerOperations && it != entries.end() - 1;) {
    it = in_slot(*it) ? it + 1 : entries.erase(it);
  }
  if (entries.size() > kMaxLedgerOperations) u.crowded = entries.size();
  if (entries.size() > kMaxLedgerEntries) {
    u.dropped_in_slot = entries.size() - kMaxLedgerEntries;
    entries.erase(entries.begin(), entries.begin() + static_cast<long>(u.dropped_in_slot));
  }
  u.entries = std::move(entries);
  return u;
}

std::string encode_ledger(const std::vector<RunEntry>& entries, unsigned long long generation) {
  Json runs = Json::array();
  for (const auto& e : entries) runs.push_back(run_entry_to_json(e));
  std::string body =
      dump_json(Json{{"schema", kRunsSchema}, {"generation", generation}, {"runs", std::move(runs)}});
  body.pop_back();  // its closing brace: the check goes last (sealed.hpp)
  return seal(body);
}

}  // namespace looplock
