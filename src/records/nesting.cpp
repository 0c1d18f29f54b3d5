#include "records/nesting.hpp"

#include <charconv>

#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/lock_holders.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/lock_id.hpp"
#include "records/lockfile.hpp"

namespace looplock {

namespace {

std::optional<long> to_long(const std::optional<std::string>& s) {
  if (!s || s->empty()) return std::nullopt;
  long v = 0;
  auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (ec != std::errc() || p != s->data() + s->size() || v < 0) return std::nullopt;
  return v;
}

std::optional<int> to_fd(const std::optional<std::string>& s) {
  auto v = to_long(s);
  if (!v || *v > 0x7fffffff) return std::nullopt;
  return static_cast<int>(*v);
}

bool is_lock_file(int fd, const sys::FileStatus& lock_file) {
  sys::FileStatus st;
  return sys::status_of_fd(fd, st) && sys::same_file(st, lock_file);
}

// Without /proc: flock(2) has no query, but the attempts below change
// nothing when the lock is held. A shared attempt on a fresh open file
// description succeeds only when nobody holds the lock exclusively (it is
// undone at once). When someone does, an exclusive attempt on `fd` is a
// no-op if `fd`'s open file description is that holder, and fails without
// effect if another one is (`fd` then holds nothing). (Were the holder to
// release between the two calls, `fd` would take the lock itself: still
// exclusive, and `fd` then does hold it.)

// Whether a process's name is looplock's, in any case (Windows' names are
// not case-sensitive: LoopLock.exe is looplock).
bool is_looplock_name(const std::optional<std::string>& name) { return name && equal_ignoring_case(*name, "looplock"); }

// Where no process inherits a lock and the system cannot say which process
// holds one (Windows): the ancestor `pid` counts as the holder only when it
// is a looplock with the creation time its current holder record gives it
// (the record alone is writable by others, the environment copyable by
// anyone, an ancestor with a reused pid has another creation time), and the
// lock is held exclusively, tested by a shared attempt through a handle of
// its own.
bool recorded_ancestor_holds(const EnvList& env, Pid pid, int dirfd, const sys::FileStatus& lock_file) {
  const UniqueFd record = sys::open_in(dirfd, record_name(), {.access = sys::OpenIn::Access::Read});
  if (!record) return false;
  const HolderRead read = read_holder(record.get());
  if (!read.record || read.record->released_at || read.record->pid != pid || read.record->pid_start.empty()) {
    return false;
  }
  // This lock's own: the ancestor exported its lock_id, and its record
  // names the same (a record copied from another loop does not).
  const std::string lock_id = lock_id_for_path(canonical_lock_path(dirfd, ""));
  if (env_get(env, env_name::kLockId) != lock_id || read.record->lock_id != lock_id) return false;
  if (sys::process_start(pid) != read.record->pid_start || !is_looplock_name(sys::process_name(pid))) return false;
  const UniqueFd fresh = sys::open_in(dirfd, kLockName, {.access = sys::OpenIn::Access::Read});
  if (!fresh || !is_lock_file(fresh.get(), lock_file)) return false;
  if (sys::try_lock(fresh.get(), /*exclusive=*/false)) return false;  // nobody holds it exclusively: closing undoes it
  return errno == EWOULDBLOCK;
}

}  // namespace

bool probe_holds_through(int fd, int dirfd, const sys::FileStatus& lock_file) {
  const UniqueFd fresh = sys::open_in(dirfd, kLockName, {.access = sys::OpenIn::Access::Read});
  if (!fresh || !is_lock_file(fresh.get(), lock_file)) return false;
  if (sys::try_lock(fresh.get(), /*exclusive=*/false)) return false;  // no exclusive holder; closing undoes it
  if (errno != EWOULDBLOCK) return false;
  return sys::try_lock(fd, /*exclusive=*/true);
}

bool holds_through(int fd, int dirfd, const sys::FileStatus& lock_file, bool exclusive) {
  if (fd < 0 || !is_lock_file(fd, lock_file)) return false;
  if (const auto holds = sys::own_fd_holds_lock(fd, lock_file, exclusive)) return *holds;
  // A shared holder through `fd` cannot be told apart this way; a shared
  // inner run then simply takes a shared lock of its own, which never waits
  // for a shared outer one.
  return probe_holds_through(fd, dirfd, lock_file);
}

std::optional<OuterHolder> find_outer_holder(const EnvList& env, int dirfd, const sys::FileStatus& lock_file,
                                             bool exclusive, Pid self) {
  auto pid = to_long(env_get(env, env_name::kHolderPid));
  auto holder_fd = to_fd(env_get(env, env_name::kHolderFd));
  if (!holder_fd) return std::nullopt;
  const Pid named = pid && *pid > 0 && *pid <= 0x7fffffff ? static_cast<Pid>(*pid) : 0;
  // This process's own descriptor, inherited from the outer looplock.
  for (auto fd : {holder_fd, to_fd(env_get(env, env_name::kFd))}) {
    if (fd && holds_through(*fd, dirfd, lock_file, exclusive))
      return OuterHolder{.pid = named, .fd = *fd, .inherited = true};
  }
  // The outer looplock's descriptor: it must be a live ancestor. Pids are
  // only comparable when /proc shows this process's own pid namespace.
  if (named == 0 || !sys::pids_comparable()) return std::nullopt;
  if (!sys::is_self_or_ancestor(named, self)) return std::nullopt;
  if (!sys::abilities().inherited_lock) {
    if (!recorded_ancestor_holds(env, named, dirfd, lock_file)) return std::nullopt;
  } else if (!sys::fd_holds_lock(named, *holder_fd, lock_file, exclusive)) {
    return std::nullopt;
  }
  return OuterHolder{.pid = named, .fd = *holder_fd, .inherited = false};
}

std::optional<int> inherited_lock_fd(const EnvList& env, const sys::FileStatus& lock_file) {
  auto fd = to_fd(env_get(env, env_name::kFd));
  if (!fd || !is_lock_file(*fd, lock_file)) return std::nullopt;
  return fd;
}

bool deadline_owner_lives(const EnvList& env, Pid self) {
  const auto owner = parse_deadline_owner(env_get(env, env_name::kDeadlineOwner));
  if (!owner || owner->start.empty() || owner->pid > 0x7fffffff || !sys::pids_comparable()) return false;
  const auto pid = static_cast<Pid>(owner->pid);
  return sys::is_self_or_ancestor(pid, self) && sys::process_start(pid) == owner->start;
}

}  // namespace looplock
