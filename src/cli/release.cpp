#include "cli/release.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/digest.hpp"
#include "os/files.hpp"
#include "os/hold_process.hpp"
#include "os/lock_holders.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/hold.hpp"
#include "records/lockfile.hpp"

namespace looplock {

namespace {

// How long the holder may take to let go once told (with --etcd it revokes
// its lease, which may wait for an unreachable etcd).
constexpr std::chrono::milliseconds kLetGo{60000};

constexpr int kNoSuchHold = 1;

struct OpenDir {
  UniqueFd fd;
  sys::FileStatus lock_file;
  bool has_lock_file = false;
};

OpenDir open_dir(const std::string& dir) {
  OpenDir d;
  d.fd = sys::open_directory(dir);
  if (d.fd) d.has_lock_file = sys::status_at(d.fd.get(), kLockName, d.lock_file) && d.lock_file.regular();
  return d;
}

std::string how_ended(int code) {
  return code == exit_code::kMaxTime ? "--max-time passed" : "its etcd lease was lost";
}

// Tells the pinned holder to let go (TERM: its sentinel ends, it releases
// like any run) and waits for it. Returns the status: 0, or how it ended
// by itself meanwhile.
std::vector<Pid> pids_of(const std::vector<sys::KernelLock>& holders) {
  std::vector<Pid> out;
  for (const auto& h : holders) out.push_back(h.pid);
  return out;
}

// "pid 12 (looplock), pid 13 (looplock)": who still holds the lock.
std::string named(const std::vector<sys::KernelLock>& holders) {
  std::string out;
  for (const auto& h : holders) {
    if (!out.empty()) out += ", ";
    out += "pid " + std::to_string(h.pid);
    if (const auto name = sys::process_name(h.pid)) out += " (" + printable(*name) + ")";
  }
  return out;
}

// Steps that run inside a hold keep its lock through its descriptor (and,
// with --etcd, keep its lease alive) until they end: their table, when the
// lock file shows such holders.
std::optional<sys::LockTable> steps_holding(int dirfd) {
  sys::FileStatus lock_file;
  if (dirfd < 0 || !sys::status_at(dirfd, kLockName, lock_file)) return std::nullopt;
  auto table = sys::lock_table(lock_file);
  if (!table || std::none_of(table->holders.begin(), table->holders.end(), [](const auto& h) { return h.exclusive; })) {
    return std::nullopt;
  }
  return table;
}

int let_go(const sys::PinnedProcess& holder, Pid pid, const std::string& start, const std::string& secret_sha256,
           int dirfd, const std::string& dir, const Logger& log) {
  const std::string shown = sys::path_in_dir(dir, kLockName);
  if (holder.wait_end(std::chrono::milliseconds(0))) {
    // Ended already: KILLed (no row), and not yet reaped where nothing
    // reaps orphans (a container whose PID 1 is a shell), or just now.
    if (const auto code = hold_ended_by(dirfd, pid, start, secret_sha256)) {
      log.error("hold_ended", "the hold of " + shown + " had already ended: " + how_ended(*code));
      return *code;
    }
    const auto steps = steps_holding(dirfd);
    log.error("no_such_hold",
              "no such hold of " + shown + ": its holder, looplock pid " + std::to_string(pid) +
                  ", has ended without its row (killed)" +
                  (steps ? "; steps that ran inside it (" + named(steps->holders) +
                               ") still hold the lock until they end"
                         : std::string()),
              {}, steps ? Json{{"holder_pids", pids_of(steps->holders)}} : Json::object());
    return kNoSuchHold;
  }
  if (!holder.terminate()) {
    const int err = errno;
    if (err == ESRCH) {
      // It ended meanwhile (--max-time, its tie): its row says how.
      if (const auto code = hold_ended_by(dirfd, pid, start, secret_sha256)) return *code;
      log.error("no_such_hold", "no such hold of " + shown + ": it has just ended");
      return kNoSuchHold;
    }
    const auto uid = sys::process_uid(pid);
    throw Fatal(exit_code::kOsError, errno_message("cannot signal hold process " + std::to_string(pid), err),
                err == EPERM ? "It runs as " + (uid ? "uid " + std::to_string(*uid) : std::string("another user")) +
                                   ": release the hold as that user, or as root."
                             : std::string());
  }
  if (!holder.wait_end(kLetGo)) {
    throw Fatal(
        exit_code::kOsError,
        "hold process " + std::to_string(pid) + " was told to let go of " + shown + " but has not ended within " +
            std::to_string(kLetGo.count() / 1000) + " s",
        "It may be stopped (SIGSTOP) or stuck: look at it with ps (looplock --inspect " + dir +
            " names it); KILL it only as a last resort (the kernel then frees the lock, but no row is written).");
  }
  if (const auto code = hold_ended_by(dirfd, pid, start, secret_sha256)) {
    log.warn("hold_ended", "the hold of " + shown + " had ended by itself first: " + how_ended(*code));
    return *code;
  }
  // Steps that run inside the hold keep the lock through its descriptor
  // (and, with --etcd, keep its lease alive) until they end: said, since
  // the lock is not free yet.
  {
    if (const auto table = steps_holding(dirfd)) {
      log.warn("hold_steps_running",
               "released the hold of " + shown + " (looplock pid " + std::to_string(pid) +
                   "), but steps that run inside it (" + named(table->holders) +
                   ") still hold the lock until they end (with --etcd they also "
                   "keep the hold's lease alive, so that no other host takes the cluster lock before then); "
                   "no new step runs inside it",
               {{"holder_pids", pids_of(table->holders)}});
      return exit_code::kOk;
    }
  }
  log.verbose("released", "released the hold of " + shown + " (looplock pid " + std::to_string(pid) + ")");
  return exit_code::kOk;
}

// Without its row (a full disk): the hold's own record, released at or
// after the end --max-time gave it.
bool ended_at_its_end(const HoldCheck& c, const HoldValue& v, const std::string& hash) {
  const auto& r = c.record;
  return r && r->pid == v.pid && r->pid_start == v.start && r->hold && r->hold->secret_sha256 == hash &&
         r->released_at && *r->released_at >= r->hold->ends_at;
}

// The holder, when its sentinel hands over the lock's descriptor for the
// secret (only the hold's own does): proof enough where the record and
// /proc/locks no longer say (DIR or its lock file moved away meanwhile).
std::optional<sys::PinnedProcess> proven_by_sentinel(const HoldValue& v) {
  if (sys::process_start(v.pid) != v.start || !sys::fetch_hold_fd(v.pid, v.start, v.secret).fd) return std::nullopt;
  return sys::PinnedProcess::pin(v.pid, v.start);
}

int release_value(const std::string& text, const Logger& log) {
  const std::optional<HoldValue> v = parse_hold_value(text);
  if (!v) {
    throw Fatal(exit_code::kUsage, "not a hold's value: " + quote(printable(text)),
                "--release reads what looplock --hold printed after LOOPLOCK_HOLD=, from $LOOPLOCK_HOLD or as "
                "its argument.");
  }
  const std::string shown = sys::path_in_dir(v->dir, kLockName);
  const OpenDir d = open_dir(v->dir);
  if (!d.fd && errno == EACCES) {
    fail_errno(exit_code::kOsError, "cannot open " + v->dir + " to end its hold", EACCES);
  }
  const std::string hash = sys::sha256_hex(v->secret);
  if (!d.fd || !d.has_lock_file) {
    const int err = errno;
    // DIR or its lock file moved away: the holder may still live, and its
    // sentinel answering to the secret proves it is the hold.
    if (auto holder = proven_by_sentinel(*v)) return let_go(*holder, v->pid, v->start, hash, -1, v->dir, log);
    log.error("no_such_hold", "no such hold: " + shown + " cannot be read (" + std::strerror(err) + ")");
    return kNoSuchHold;
  }
  HoldCheck c = check_hold(*v, d.fd.get(), d.lock_file);
  if (c.unreadable) {
    throw Fatal(exit_code::kOsError, "the hold of " + shown + " " + c.why,
                "Release it as the user that took it, or as root (or give this user read access to the lock file).");
  }
  std::optional<sys::PinnedProcess> holder;
  if (c.live) {
    holder = sys::PinnedProcess::pin(v->pid, v->start);
    if (!holder && errno != ESRCH)
      fail_errno(exit_code::kOsError, "cannot pin hold process " + std::to_string(v->pid), errno);
  } else {
    holder = proven_by_sentinel(*v);  // its lock file replaced, say
  }
  if (!holder) {
    if (const auto code = hold_ended_by(d.fd.get(), v->pid, v->start, hash)) {
      log.error("hold_ended", "the hold of " + shown + " had already ended: " + how_ended(*code));
      return *code;
    }
    if (ended_at_its_end(c, *v, hash)) {
      log.error("hold_ended", "the hold of " + shown +
                                  " had already ended: --max-time passed (its record was "
                                  "released at its end; its incident row could not be read)");
      return exit_code::kMaxTime;
    }
    log.error("no_such_hold", "no such hold of " + shown + ": the hold " + (c.live ? "has just ended" : c.why));
    return kNoSuchHold;
  }
  return let_go(*holder, v->pid, v->start, hash, d.fd.get(), v->dir, log);
}

// What the kernel must confirm of the record's hold before --force ends
// it; empty when it does.
std::string unconfirmed(const HolderRecord& r, const sys::FileStatus& lock_file) {
  const std::string pid = std::to_string(r.pid);
  const auto table = sys::lock_table(lock_file);
  if (!table) return std::string("the system's lock table cannot be read (") + std::strerror(errno) + ")";
  bool holds = false;
  for (const auto& h : table->holders) holds = holds || (h.exclusive && (h.pid == r.pid || h.locked_by == r.pid));
  if (!holds) return "process " + pid + " does not hold it (the kernel shows another holder, or none)";
  std::optional<std::string> exe = sys::process_executable(r.pid);
  std::string name = exe ? *exe : sys::process_name(r.pid).value_or("");
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) name.erase(0, slash + 1);
  if (name.ends_with(" (deleted)")) name.erase(name.size() - 10);
  if (name != "looplock" && name != "looplock-etcd") return "process " + pid + " is not looplock (" + name + ")";
  if (sys::process_start(r.pid) != r.pid_start) return "process " + pid + " has another start time than the record's";
  return {};
}

int release_forced(const std::string& dir, const Logger& log) {
  const std::string shown = sys::path_in_dir(dir, kLockName);
  const OpenDir d = open_dir(dir);
  if (!d.fd) fail_errno(exit_code::kNoInput, "cannot open " + dir, errno);
  const UniqueFd fd =
      d.has_lock_file ? sys::open_in(d.fd.get(), record_name(), {.access = sys::OpenIn::Access::Read}) : UniqueFd();
  const int open_err = fd ? 0 : errno;
  const HolderRead read = fd ? read_holder(fd.get()) : HolderRead{};
  if (d.has_lock_file && (!fd || read.state == HolderRead::State::Error)) {
    throw Fatal(exit_code::kOsError,
                errno_message("cannot read the holder record of " + shown, fd ? (read.err ? read.err : EIO) : open_err),
                "End the hold as the user that took it, or as root.");
  }
  const HolderRecord* r = read.record ? &*read.record : nullptr;
  if (!r || r->released_at) {
    log.error("no_such_hold", "no hold of " + shown + ": its holder record names no current holder");
    return kNoSuchHold;
  }
  if (!r->hold) {
    log.error("no_such_hold",
              shown + " is held by a run, not by a hold (looplock pid " + std::to_string(r->pid) + ", operation " +
                  printable(r->operation) + "); --release --force ends only holds",
              "End that run itself, or wait for it.");
    return kNoSuchHold;
  }
  if (const std::string why = unconfirmed(*r, d.lock_file); !why.empty()) {
    log.error("no_such_hold", "not ending the hold that the holder record of " + shown + " names: " + why);
    return kNoSuchHold;
  }
  const std::optional<sys::PinnedProcess> holder = sys::PinnedProcess::pin(r->pid, r->pid_start);
  if (!holder && errno != ESRCH)
    fail_errno(exit_code::kOsError, "cannot pin hold process " + std::to_string(r->pid), errno);
  if (!holder) {
    log.error("no_such_hold", "no such hold of " + shown + ": it has just ended");
    return kNoSuchHold;
  }
  return let_go(*holder, r->pid, r->pid_start, r->hold->secret_sha256, d.fd.get(), dir, log);
}

}  // namespace

int release_hold(const Options& o, const Logger& log) {
  return o.hold.force ? release_forced(o.dir, log) : release_value(o.hold.release_value, log);
}

}  // namespace looplock
