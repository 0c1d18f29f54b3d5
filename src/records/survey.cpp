#include "records/survey.hpp"

#include <algorithm>
#include <cerrno>

#include "base/error.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/lock_holders.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"

namespace looplock {

namespace {

// The kernel's holders with what names them.
void add_holders(LockFacts& f, const std::vector<sys::KernelLock>& locks) {
  for (const auto& k : locks) {
    if (k.locked_by != 0 &&
        std::find(f.dead_kernel_pids.begin(), f.dead_kernel_pids.end(), k.locked_by) == f.dead_kernel_pids.end()) {
      if (!sys::process_alive(k.locked_by)) f.dead_kernel_pids.push_back(k.locked_by);
    }
  }
  for (const auto& k : locks) {
    LockHolder h;
    h.pid = k.pid;
    h.exclusive = k.exclusive;
    h.locked_by = k.locked_by;
    h.exited = k.locked_by == 0 && !sys::process_alive(k.pid);
    if (h.exited) {
      if (std::find(f.dead_kernel_pids.begin(), f.dead_kernel_pids.end(), k.pid) == f.dead_kernel_pids.end()) {
        f.dead_kernel_pids.push_back(k.pid);
      }
    } else {
      h.command = sys::process_name(k.pid).value_or("");
      h.start = sys::process_start(k.pid);
      h.uid = sys::process_uid(k.pid);
      if (h.uid) h.gids = sys::process_groups(k.pid).value_or(std::vector<Gid>{});
    }
    f.holders.push_back(std::move(h));
  }
}

}  // namespace

std::vector<sys::KernelLock> live_holders(const sys::FileStatus& file) {
  auto table = sys::lock_table(file);
  if (!table) return {};
  return std::move(table->holders);
}

std::vector<sys::KernelLock> kernel_holders(const HolderRead& read, const sys::FileStatus& file,
                                               const std::vector<sys::KernelLock>& hint) {
  if (!hint.empty()) {
    std::vector<Pid> pids;
    for (const auto& k : hint) pids.push_back(k.pid);
    if (sys::holding_lock(pids, file).size() == pids.size()) return hint;
  }
  if (read.record && !read.record->released_at) {
    if (auto h = sys::holders_among({read.record->pid}, file); !h.empty()) return h;
  }
  return live_holders(file);
}

void survey_record_process(LockFacts& f) {
  if (!f.record.record) return;
  const HolderRecord& rec = *f.record.record;
  if (auto at = sys::parse_utc_ms(rec.acquired_at)) f.record_age_ms = sys::realtime_ms() - *at;
  // A holder that wrote its record inside a pid namespace of its own appears
  // here under another pid (NSpid), with the same start time.
  for (const auto& h : f.holders) {
    if (h.pid == rec.pid || h.exited) continue;
    auto nspids = sys::namespace_pids(h.pid);
    if (nspids.size() > 1 && std::find(nspids.begin() + 1, nspids.end(), rec.pid) != nspids.end()) {
      if (!rec.pid_start.empty() && h.start && *h.start == rec.pid_start) {
        f.record_pid_alive = true;
        f.record_same_process = true;
        f.record_pid_here = h.pid;
        f.record_pid_note =
            "pid " + std::to_string(rec.pid) + " in its own pid namespace, pid " + std::to_string(h.pid) + " here";
        return;
      }
    }
  }
  f.record_pid_alive = sys::process_alive(rec.pid);
  if (!*f.record_pid_alive) {
    if (sys::in_child_pid_namespace()) {
      f.record_pid_alive.reset();
      f.record_pid_note = "not visible from this pid namespace (the record may come from outside it)";
    }
    return;
  }
  auto start = sys::process_start(rec.pid);
  if (start && !rec.pid_start.empty()) f.record_same_process = *start == rec.pid_start;
  if (f.record_same_process == false && sys::in_child_pid_namespace()) {
    // Another process has that pid here; the record's may live outside this
    // pid namespace, where the pid names another: unknown, not reused.
    f.record_same_process.reset();
    f.record_pid_alive.reset();
    f.record_pid_note = "not visible from this pid namespace (pid " + std::to_string(rec.pid) +
                        " here is another process; the record may come from outside it)";
    return;
  }
  if (!f.record_same_process) {
    f.record_pid_note = rec.pid_start.empty() ? "no start time was recorded" : "its start time cannot be read";
  }
}

LockFacts survey_held(const LockFile& file, const std::string& lock_path, const std::vector<sys::KernelLock>& hint) {
  LockFacts f;
  f.lock_path = lock_path;
  f.seen_held = true;
  // What tells a looplock that may only read the lock file (the group recipe
  // under umask 022) from another tool's holder, as survey_lock() does.
  f.file_uid = file.st.owner;
  f.group_can_write = (file.st.mode & sys::mode::kGroupWrite) != 0;
  const int record = record_fd(file);
  f.record = record >= 0
                 ? read_holder(record)
                 : HolderRead{.state = HolderRead::State::Error, .record = std::nullopt, .size = 0, .err = errno};
  add_holders(f, kernel_holders(f.record, file.st, hint));
  if (f.holders.empty()) {
    errno = 0;
    const bool listed = sys::lock_table(file.st).has_value();
    const int err = errno;
    if (!listed && err == ENOSYS) {
      // This run's own attempt found it held; a shared attempt tells in
      // which mode (undone at once when it succeeds).
      f.tested_by_taking = f.holders_unlisted = true;
      f.tested_exclusive = !sys::try_lock(file.fd.get(), /*exclusive=*/false);
      if (!f.tested_exclusive) (void)sys::unlock(file.fd.get());
    } else if (!listed) {
      f.kernel_unknown = errno_message("cannot read /proc/locks", err ? err : EIO);
    } else if (sys::in_child_pid_namespace()) {
      f.kernel_unknown = "the holder is not listed: it may hold the lock from outside this pid namespace";
    }
  }
  survey_record_process(f);
  return f;
}

namespace {

// Where the system lists no lock holders (os/lock_holders.hpp: ENOSYS,
// Windows), whether the lock is held is told by taking it for an instant,
// through a handle of its own: exclusively (free), else shared (held
// exclusively when that fails too, else shared). Never called free untested.
void test_by_taking(const LockDir& dir, LockFacts& f) {
  const UniqueFd fd = sys::open_in(dir.fd.get(), kLockName, {.access = sys::OpenIn::Access::Read});
  if (!fd) {
    f.kernel_unknown = errno_message(
        "the system lists no lock holders, and the lock file cannot be opened to test "
        "the lock",
        errno);
    return;
  }
  f.tested_by_taking = f.holders_unlisted = true;
  if (sys::try_lock(fd.get(), /*exclusive=*/true)) {
    (void)sys::unlock(fd.get());
    return;  // free
  }
  f.seen_held = true;
  f.tested_exclusive = !sys::try_lock(fd.get(), /*exclusive=*/false);
  if (!f.tested_exclusive) (void)sys::unlock(fd.get());
}

}  // namespace

LockFacts survey_lock(const LockDir& dir, const std::string& lock_path, std::vector<sys::KernelLock>& waiters) {
  LockFacts f;
  f.lock_path = lock_path;
  f.dir_uid = dir.st.owner;
  f.network_fs = sys::network_file_system(dir.fd.get());
  if (auto r = refuse_dir(dir.st, dir.path)) f.refusal = r;

  sys::FileStatus st;
  if (!sys::status_at(dir.fd.get(), kLockName, st)) {
    const int err = errno;
    if (err == ENOENT) {
      f.exists = false;
      errno = 0;
      f.holders_unlisted = !sys::lock_table(dir.st) && errno == ENOSYS;
      return f;
    }
    lock_stat_failed(dir, err);
  }
  if (!f.refusal) f.refusal = refuse_lock_file(st, dir.st, sys::own_euid(), dir.path);
  sys::FileStatus record_st;
  if (!f.refusal && record_beside_lock() && sys::status_at(dir.fd.get(), kHolderName, record_st)) {
    // The record's own file, under the same rules (a run refuses it too).
    f.refusal =
        refuse_file(record_st, dir.st, sys::own_euid(), "holder record", kHolderName, "unsafe_lock_file", dir.path);
    if (f.refusal) f.refusal->why = std::string(kHolderName) + " beside it: " + f.refusal->why;
  }
  f.file_uid = st.owner;
  if (st.mode & sys::mode::kGroupRead) f.sharing_gid = st.group;
  f.group_can_write = (st.mode & sys::mode::kGroupWrite) != 0;
  f.others_can_read = (st.mode & sys::mode::kOtherRead) != 0;
  if (!st.regular()) return f;

  // The record's file: the lock file itself, or the one beside it
  // (lockfile.hpp), which a lock file that never had a holder lacks.
  const UniqueFd fd = sys::open_in(dir.fd.get(), record_name(), {.access = sys::OpenIn::Access::Read});
  const int open_err = fd ? 0 : errno;
  const bool missing_record = record_beside_lock() && open_err == ENOENT;  // no holder wrote one yet
  if (fd && !record_beside_lock()) {
    (void)sys::status_of_fd(fd.get(), st);
  }
  // The record, the kernel's table, and the record again: a holder that
  // took or released the lock meanwhile changed the record, and the table is
  // read once more (a bounded number of times), so that the two agree.
  for (int round = 0; round < 3; ++round) {
    f.record = fd ? read_holder(fd.get())
                  : HolderRead{.state = missing_record ? HolderRead::State::Empty : HolderRead::State::Error,
                               .record = std::nullopt,
                               .size = 0,
                               .err = missing_record ? 0 : open_err};
    errno = 0;
    auto table = sys::lock_table(st);
    f.holders.clear();
    f.dead_kernel_pids.clear();
    waiters.clear();
    if (!table && errno == ENOSYS) {
      test_by_taking(dir, f);
      break;
    }
    if (!table) {
      f.kernel_unknown = errno_message("cannot read /proc/locks", errno ? errno : EIO);
      break;
    }
    waiters = table->waiters;
    add_holders(f, table->holders);
    if (f.holders.empty() && sys::in_child_pid_namespace() && sys::namespace_pids(0).size() <= 1) {
      f.kernel_unknown =
          "no holder is listed, but this runs in a pid namespace of its own, whose /proc/locks does "
          "not list a holder outside it";
    }
    const HolderRead again = fd ? read_holder(fd.get()) : f.record;
    const bool same = again.state == f.record.state && again.size == f.record.size &&
                      (!again.record || (f.record.record && again.record->acquired_at == f.record.record->acquired_at &&
                                         again.record->released_at == f.record.record->released_at));
    if (same) break;
  }
  survey_record_process(f);
  return f;
}

}  // namespace looplock
