#include "records/ledger.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/procfs.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/sealed.hpp"

namespace looplock {

namespace {

// kMaxLedgerEntries entries of the longest names fit (each about 2 KB).
constexpr size_t kMaxLedgerBytes = 4 << 20;

// Reserves the blocks of `size` bytes of `fd` beyond its end without
// changing its size (FALLOC_FL_KEEP_SIZE), so that a crash before the write
// leaves the ledger as it was; where the file system cannot, by
// posix_fallocate(3), whose NUL bytes past the end readers skip. 0 or errno.
int reserve(int fd, size_t size) {
  if (sys::retry_eintr([&] { return fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)); }) == 0) return 0;
  if (errno != EOPNOTSUPP && errno != ENOSYS) return errno;
  int err;
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (err == EINTR);
  return err;
}

// Whether a name is stored as it is: valid UTF-8 of at most 256 bytes.
bool stored_as_is(const std::string& name) { return name.size() <= kMaxIdentityBytes && valid_utf8(name); }

std::string ledger_display(const LockDir& dir) {
  return dir.path + (dir.path.ends_with('/') ? "" : "/") + kRunsName;
}

}  // namespace

std::optional<Refusal> refuse_ledger(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid,
                                     std::string_view shown_dir) {
  return refuse_file(file, dir, euid, "run ledger", kRunsName, "unsafe_run_ledger", shown_dir);
}

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
  std::string out = "host " + e.host + " pid " + std::to_string(e.pid) + " (agent " + e.agent +
                    "), which started at " + sys::utc_iso8601(e.started_ms);
  if (e.ended_ms) {
    out += " and ended at " + sys::utc_iso8601(*e.ended_ms);
    if (e.exit_status) out += " with status " + std::to_string(*e.exit_status);
  } else {
    out += " and has not recorded its end";
  }
  return out;
}

bool runner_proven_dead(const RunEntry& e) { return procfs::proven_dead(e.boot_id, e.pid_ns, e.pid, e.pid_start); }

SlotVerdict judge_slot(const std::optional<RunEntry>& entry, long long now_ms, long long once_per_ms) {
  if (!entry) return {};
  const long long since = now_ms - entry->started_ms;
  if (since >= once_per_ms) return {};
  if (since < -once_per_ms) return {Slot::Damaged, -since};
  const long long ahead = since < 0 ? -since : 0;
  return {entry->ended_ms ? Slot::Done : Slot::Running, ahead};
}

LedgerRead read_ledger(const LockDir& dir) {
  LedgerRead out;
  sys::FileStatus st;
  if (!sys::status_at(dir.fd.get(), kRunsName, st)) {
    if (errno == ENOENT) return out;
    fail_errno(status_for_errno(errno, exit_code::kCantCreate), "cannot stat " + ledger_display(dir), errno, "",
               "run_ledger_unusable");
  }
  if (auto r = refuse_ledger(st, dir.st, geteuid(), dir.path)) {
    throw Fatal(exit_code::kCantCreate, "unsafe run ledger " + ledger_display(dir) + ": " + r->why, r->hint, r->event);
  }
  UniqueFd fd(sys::retry_eintr(
      [&] { return openat(dir.fd.get(), kRunsName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  if (!fd) {
    const int err = errno;
    fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot open " + ledger_display(dir), err,
               err == EACCES ? "--once-per reads it under the lock: its owner (uid " + std::to_string(st.owner) +
                                   ") or root lets the group that shares DIR read and write it (chgrp GROUP " +
                                   ledger_display(dir) + "; chmod g+rw " + ledger_display(dir) + ")."
                             : "",
               "run_ledger_unusable");
  }
  // Rewritten in place under the lock: a read without it that overlapped a
  // write fails its check, and is taken again.
  std::optional<std::string> text;
  std::optional<Unsealed> object;
  for (int attempt = 0; attempt < 5 && !(object && object->checked); ++attempt) {
    if (attempt > 0) sys::sleep_until_ns(sys::monotonic_ns() + 2'000'000);
    text = sys::pread_all(fd.get(), kMaxLedgerBytes);
    if (!text) fail_errno(exit_code::kOsError, "cannot read " + ledger_display(dir), errno, "", "run_ledger_unusable");
    // NUL bytes past the newline: blocks reserved for a rewrite that never
    // came (a crash), where the file system could not keep the size.
    while (!text->empty() && text->back() == '\0') text->pop_back();
    if (text->empty()) return out;
    object = unseal(*text);
  }
  const Json j = object && object->checked ? Json::parse(object->object.begin(), object->object.end(), nullptr, false)
                                           : Json(nullptr);
  if (!j.is_object() || j.value("schema", std::string()) != kRunsSchema || !j.contains("runs") ||
      !j["runs"].is_array()) {
    out.unreadable = true;
    return out;
  }
  for (const auto& item : j["runs"]) {
    if (auto e = run_entry_from_json(item)) {
      out.entries.push_back(std::move(*e));
    } else {
      out.damaged.push_back(item.is_object() && item.contains("operation") && item["operation"].is_string()
                                ? item["operation"].get<std::string>()
                                : "?");
    }
  }
  return out;
}

std::optional<RunEntry> entry_of(const LedgerRead& ledger, const std::string& operation) {
  for (auto it = ledger.entries.rbegin(); it != ledger.entries.rend(); ++it) {
    if (it->operation == operation) return *it;
  }
  return std::nullopt;
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

std::string encode_ledger(const std::vector<RunEntry>& entries) {
  Json runs = Json::array();
  for (const auto& e : entries) runs.push_back(run_entry_to_json(e));
  std::string body = dump_json(Json{{"schema", kRunsSchema}, {"runs", std::move(runs)}});
  body.pop_back();  // its closing brace: the check goes last (sealed.hpp)
  return seal(body);
}

LedgerLook look_local_ledger(const LockDir& dir, const std::string& operation) {
  const LedgerRead read = read_ledger(dir);
  LedgerLook look;
  look.entry = entry_of(read, operation);
  look.whole = read.unreadable;
  look.damaged = read.unreadable ||
                 std::find(read.damaged.begin(), read.damaged.end(), operation) != read.damaged.end() ||
                 (!look.entry && std::find(read.damaged.begin(), read.damaged.end(), "?") != read.damaged.end());
  return look;
}

LedgerUpdate record_local_ledger(const LockDir& dir, const RunEntry& entry, long long now_ms) {
  const LedgerRead read = read_ledger(dir);
  LedgerUpdate u = with_entry(read.entries, entry, now_ms);
  if (const int err = write_ledger(dir, u.entries); err != 0) {
    const std::string path = ledger_display(dir);
    const std::string why =
        err == ENOSPC ? "The file system is full; the ledger was left as it was. "
        : err == EPERM || err == EACCES
            ? "You may neither write it nor replace it (in a sticky DIR only its owner may): its owner or root lets "
              "the group write it (chmod g+rw " + path + "), or DIR's owner makes it once for the group (install -m "
              "0660 -g GROUP /dev/null " + path + "). "
            : "";
    fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot write the run ledger " + path, err,
               why + "--once-per records each run there before the command starts; the command did not run.",
               "run_ledger_unusable");
  }
  return u;
}

int write_ledger(const LockDir& dir, const std::vector<RunEntry>& entries) {
  const std::string data = encode_ledger(entries);
  // In place when this process may write the file (no journal transaction:
  // sealed.hpp); a torn write fails its check, so it reads as no entry.
  UniqueFd in_place(sys::retry_eintr(
      [&] { return openat(dir.fd.get(), kRunsName, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  if (in_place) {
    sys::FileStatus st;
    if (!sys::status_of_fd(in_place.get(), st)) return errno;
    if (refuse_ledger(st, dir.st, geteuid())) return EPERM;
    // Its new length first: a full disk then fails here, before a byte of
    // the ledger changed (a torn ledger would lose every operation's slot).
    if (static_cast<size_t>(st.size) < data.size()) {
      if (const int err = reserve(in_place.get(), data.size()); err != 0) return err;
    }
    return write_over(in_place.get(), data, static_cast<long long>(kMaxLedgerBytes)) ? 0 : errno;
  }
  if (errno != ENOENT && errno != EACCES && errno != EPERM) return errno;
  // Missing, or a group member's file this process may not write: a new
  // file beside it, renamed over it. Only the lock's holder writes the
  // ledger, so one name for the new file serves; one left by a looplock that
  // died mid-write is replaced.
  const auto create = [&] {
    return sys::retry_eintr([&] {
      return openat(dir.fd.get(), kRunsNewName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY,
                    kCreateMode);
    });
  };
  UniqueFd fd(create());
  if (!fd && errno == EEXIST) {
    (void)unlinkat(dir.fd.get(), kRunsNewName, 0);
    fd.reset(create());
  }
  if (!fd) return errno;
  int err = sys::write_all(fd.get(), data) ? 0 : errno;
  if (err == 0 && ::close(fd.release()) != 0) err = errno;
  if (err == 0 && renameat(dir.fd.get(), kRunsNewName, dir.fd.get(), kRunsName) != 0) err = errno;
  if (err != 0) (void)unlinkat(dir.fd.get(), kRunsNewName, 0);
  return err;
}

}  // namespace looplock
