#include "records/coalesce.hpp"

#include <algorithm>
#include <cerrno>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/json.hpp"
#include "base/text.hpp"
#include "os/clock.hpp"
#include "os/digest.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

// How long an absorbed run looks for the record of the run in the seat (it
// writes it a moment after taking the seat), and how often.
constexpr Duration kRecordWait = std::chrono::seconds(1);
constexpr Duration kRecordRetry = std::chrono::milliseconds(5);
// Absorbed lines are about 150 bytes: a seat that absorbed this much has its
// count cut here.
constexpr size_t kSeatReadLimit = 1 << 20;

std::string seat_display(const LockDir& dir, const std::string& name) { return sys::path_in_dir(dir.path, name); }

// Why the caller may not write the seat's file, with the fix.
std::string unwritable(const LockDir& dir, const std::string& name, int err) {
  const std::string path = shell_word(seat_display(dir, name));
  sys::FileStatus st;
  if (err == EROFS) return "DIR's file system is read-only";
  if (sys::status_at(dir.fd.get(), name.c_str(), st)) {
    if (st.owner == sys::own_euid()) {  // its own write permission taken away: only u+w helps
      return "you may not write it, though it is yours (mode " + octal_mode(st.mode) + "): make it writable (chmod u+w " +
             path + ")";
    }
    return "you may not write it (owner uid " + std::to_string(st.owner) + ", mode " + octal_mode(st.mode) +
           "): its owner or root lets the group that shares DIR read and write it (chmod g+rw " + path +
           "), or a run made it under umask 002";
  }
  return "you may not create it in DIR: let the runs' users create files there, or make it once (install -m 0660 "
         "-g GROUP /dev/null " +
         path + ")";
}

// The seat's file, created (kCreateMode) when missing, for reading and
// writing, judged by the rules of every file beside the lock file; invalid
// (`why` set) when the caller may not write it.
UniqueFd open_seat(const LockDir& dir, const std::string& name, std::optional<std::string>& why) {
  sys::FileStatus st;
  if (sys::status_at(dir.fd.get(), name.c_str(), st)) {
    if (auto r = refuse_file(st, dir.st, sys::own_euid(), "coalesce seat", name, "unsafe_coalesce_seat", dir.path)) {
      throw Fatal(exit_code::kCantCreate, "unsafe coalesce seat " + seat_display(dir, name) + ": " + r->why, r->hint,
                  r->event);
    }
  }
  UniqueFd fd = sys::open_in(dir.fd.get(), name,
                             {.access = sys::OpenIn::Access::ReadWrite,
                              .create = sys::OpenIn::Create::IfMissing,
                              .mode = kCreateMode,
                              .above_stdio = true});
  if (!fd) {
    const int err = errno;
    if (err == EACCES || err == EROFS || err == EPERM) {
      why = unwritable(dir, name, err);
      return fd;
    }
    fail_errno(status_for_errno(err, exit_code::kCantCreate),
               "cannot open -p coalesce's seat " + seat_display(dir, name), err, "", "coalesce_unusable");
  }
  if (!sys::status_of_fd(fd.get(), st)) {
    fail_errno(exit_code::kOsError, "cannot stat " + seat_display(dir, name), errno, "", "coalesce_unusable");
  }
  if (auto r = refuse_file(st, dir.st, sys::own_euid(), "coalesce seat", name, "unsafe_coalesce_seat", dir.path)) {
    throw Fatal(exit_code::kCantCreate, "unsafe coalesce seat " + seat_display(dir, name) + ": " + r->why, r->hint,
                r->event);
  }
  return fd;
}

// The run in the seat, once its record is there and its process lives.
std::optional<HolderRecord> live_record(int fd) {
  const auto text = sys::pread_all(fd, kSeatReadLimit);
  if (!text) return std::nullopt;
  auto r = seat_record(*text);
  if (!r || r->pid <= 0) return std::nullopt;
  const auto start = sys::process_start(r->pid);
  if (!start || (!r->pid_start.empty() && *start != r->pid_start)) return std::nullopt;
  return r;
}

}  // namespace

std::string coalesce_name(const std::string& operation, bool shared) {
  const std::string key = shared ? operation + std::string("\0shared", 7) : operation;
  return std::string(kCoalescePrefix) + sys::sha256_hex(key).substr(0, 16);
}

Seat take_seat(const LockDir& dir, const HolderRecord& me, bool shared) {
  Seat seat;
  seat.name = coalesce_name(me.operation, shared);
  UniqueFd fd = open_seat(dir, seat.name, seat.unavailable);
  if (!fd) return seat;
  if (sys::try_lock(fd.get(), /*exclusive=*/true, sys::LockAt::PastData)) {
    {
      // A record left by a run that died in the seat (KILLed while it
      // waited), with the runs it had absorbed: this run runs for them, and
      // says so. Then gone, with absorbed lines that came after a holder
      // left, before this one is written.
      if (const auto text = sys::pread_all(fd.get(), kSeatReadLimit)) {
        if (auto dead = seat_record(*text)) {
          seat.inherited = count_absorbed(*text, *dead).count;
          if (seat.inherited > 0) seat.dead_waiter = std::move(dead);
        }
      }
      if (!sys::truncate_fd(fd.get(), 0) || !sys::pwrite_all(fd.get(), encode_holder(me))) {
        seat.record_err = errno != 0 ? errno : EIO;
      }
      seat.fd = std::move(fd);
      return seat;
    }
  }
  // Taken: by a run that waits (or is just leaving it for the lock, about
  // to run: this run's work is done by it either way), never by this one,
  // even once it is free again. Its record, for the line, within a second
  // (it is written a moment after the seat is taken; on a full disk never).
  const Instant until = MonotonicClock::now() + kRecordWait;
  while (!(seat.waiter = live_record(fd.get())) && MonotonicClock::now() < until) nap(kRecordRetry);
  return seat;
}

bool absorb(const LockDir& dir, const Seat& seat, Pid self, const std::string& self_start, long long started_ms) {
  if (!seat.waiter) return true;  // nothing to name: the run in the seat keeps no record
  const UniqueFd fd = sys::open_in(dir.fd.get(), seat.name,
                                   {.access = sys::OpenIn::Access::Write, .append = true, .above_stdio = true});
  if (!fd) return false;
  return sys::append_row(fd.get(),
                         encode_absorbed(*seat.waiter, self, self_start, sys::utc_now_iso8601(), started_ms));
}

Absorbed leave_seat(Seat& seat, const HolderRecord& me) {
  if (!seat.fd) return {};
  const auto text = sys::pread_all(seat.fd.get(), kSeatReadLimit);
  const Absorbed count = text ? count_absorbed(*text, me) : Absorbed{};
  (void)sys::truncate_fd(seat.fd.get(), 0);
  (void)sys::unlock(seat.fd.get(), sys::LockAt::PastData);
  seat.fd.reset();
  return count;
}

std::string encode_absorbed(const HolderRecord& waiter, Pid self, const std::string& self_start, const std::string& at,
                            long long started_ms) {
  const Json j = {{"absorbed_by", {{"pid", waiter.pid}, {"pid_start", waiter.pid_start}}},
                  {"pid", self},
                  {"pid_start", self_start},
                  {"at", at},
                  {"started_ms", started_ms}};
  return dump_json(j) + "\n";
}

std::optional<HolderRecord> seat_record(std::string_view content) {
  const size_t nl = content.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  return parse_holder(content.substr(0, nl + 1));
}

Absorbed count_absorbed(std::string_view content, const HolderRecord& waiter) {
  Absorbed count;
  size_t at = content.find('\n');  // the first line is the seat's record
  while (at != std::string_view::npos && at + 1 < content.size()) {
    const size_t from = at + 1;
    at = content.find('\n', from);
    if (at == std::string_view::npos) break;  // a line cut short
    const auto line = content.substr(from, at - from);
    const Json j = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("absorbed_by") || !j["absorbed_by"].is_object()) continue;
    const Json& by = j["absorbed_by"];
    const bool pid = by.contains("pid") && by["pid"].is_number_integer() && by["pid"].get<long long>() == waiter.pid;
    const bool start = by.contains("pid_start") && by["pid_start"].is_string() &&
                       by["pid_start"].get<std::string>() == waiter.pid_start;
    if (!pid || !start) continue;
    ++count.count;
    if (j.contains("started_ms") && j["started_ms"].is_number_integer()) {
      const long long ms = j["started_ms"].get<long long>();
      count.newest_started_ms = std::max(count.newest_started_ms.value_or(ms), ms);
    }
  }
  return count;
}

}  // namespace looplock
