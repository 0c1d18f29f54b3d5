// files.hpp on POSIX (Linux): openat(2), renameat2(2), flock(2), and a
// timer that bounds a blocking flock(2).
#include "os/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include "os/posix/files.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {

// Moves `fd` to 3 or above (see open_directory).
UniqueFd moved_above_stdio(UniqueFd fd) {
  if (!fd || fd.get() >= 3) return fd;
  return UniqueFd(fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));  // `fd` closes here; errno is the dup's
}

int open_flags(const OpenIn& how) {
  int flags = O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC;
  switch (how.access) {
    case OpenIn::Access::Read: flags |= O_RDONLY; break;
    case OpenIn::Access::Write: flags |= O_WRONLY; break;
    case OpenIn::Access::ReadWrite: flags |= O_RDWR; break;
  }
  if (how.create != OpenIn::Create::No) flags |= O_CREAT;
  if (how.create == OpenIn::Create::New) flags |= O_EXCL;
  if (how.append) flags |= O_APPEND;
  if (how.truncate) flags |= O_TRUNC;
  return flags;
}

// A monotonic timer that interrupts a blocking flock(2) with SIGALRM,
// whatever SIGALRM's inherited disposition and mask: it fires at `first_ns`,
// then every `interval_ns` (the deadline's re-fires, so that a signal that
// lands between the clock check and the next flock(2) call costs at most
// that long; the caller's ticks).
// disarm() (also run by the destructor, which cannot report) stops it,
// discards pending timer signals and restores SIGALRM's disposition and
// mask. Every step is checked: a timer that cannot be armed would make the
// wait unbounded, one that cannot be stopped would go on firing at looplock
// and the command.
class DeadlineAlarm {
public:
  DeadlineAlarm() = default;
  DeadlineAlarm(const DeadlineAlarm&) = delete;
  DeadlineAlarm& operator=(const DeadlineAlarm&) = delete;
  ~DeadlineAlarm() { (void)disarm(); }

  // Arms it to fire first at `first_ns` (CLOCK_MONOTONIC). nullptr, or what
  // failed (errno set).
  const char* arm(long long first_ns, long long interval_ns) {
    struct sigaction sa {};
    sa.sa_handler = [](int) {};  // only there to make flock(2) return EINTR
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART
    if (sigaction(SIGALRM, &sa, &old_action_) != 0) return "cannot set up the deadline timer's signal";
    sigevent sev{};
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGALRM;
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer_) != 0) {
      const int err = errno;
      sigaction(SIGALRM, &old_action_, nullptr);
      errno = err;
      return "cannot create the deadline timer";
    }
    itimerspec its{};
    its.it_value.tv_sec = static_cast<time_t>(first_ns / 1'000'000'000LL);
    its.it_value.tv_nsec = static_cast<long>(first_ns % 1'000'000'000LL);
    its.it_interval.tv_sec = static_cast<time_t>(interval_ns / 1'000'000'000LL);
    its.it_interval.tv_nsec = static_cast<long>(interval_ns % 1'000'000'000LL);
    if (timer_settime(timer_, TIMER_ABSTIME, &its, nullptr) != 0) {
      const int err = errno;
      timer_delete(timer_);
      sigaction(SIGALRM, &old_action_, nullptr);
      errno = err;
      return "cannot arm the deadline timer";
    }
    armed_ = true;
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alrm, &old_mask_);
    return nullptr;
  }

  bool armed() const { return armed_; }

  // Stops the timer for good. nullptr, or what failed (errno set).
  const char* disarm() {
    if (!armed_) return nullptr;
    armed_ = false;
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alrm, nullptr);
    if (timer_delete(timer_) != 0) {
      const int err = errno;
      itimerspec stop{};
      if (timer_settime(timer_, 0, &stop, nullptr) != 0) {
        // SIGALRM stays blocked: the timer cannot reach anyone now.
        errno = err;
        return "cannot stop the deadline timer";
      }
    }
    timespec zero{};
    while (sigtimedwait(&alrm, nullptr, &zero) == SIGALRM) {
    }
    // Restoring can only fail where nothing is lost: the handler does
    // nothing, and a command gets the inherited state from job_control.cpp anyway.
    sigaction(SIGALRM, &old_action_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    return nullptr;
  }

private:
  timer_t timer_{};
  bool armed_ = false;
  struct sigaction old_action_ {};
  sigset_t old_mask_{};
};

constexpr long long kRefireNs = 1'000'000;

}  // namespace

UniqueFd open_directory(const std::string& path) {
  return moved_above_stdio(
      UniqueFd(retry_eintr([&] { return ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); })));
}

UniqueFd open_in(int dirfd, const std::string& name, const OpenIn& how) {
  UniqueFd fd(retry_eintr([&] { return openat(dirfd, name.c_str(), open_flags(how), how.mode); }));
  return how.above_stdio ? moved_above_stdio(std::move(fd)) : std::move(fd);
}

bool may_access(int dirfd, const std::string& name, Permission want) {
  const int how = (want.read ? R_OK : 0) | (want.write ? W_OK : 0) | (want.search ? X_OK : 0);
  return faccessat(dirfd, name.c_str(), how == 0 ? F_OK : how, AT_EACCESS | AT_SYMLINK_NOFOLLOW) == 0;
}

bool append_row(int fd, std::string_view row) {
  const ssize_t n = retry_eintr([&] { return write(fd, row.data(), row.size()); });
  if (n < 0) return false;
  if (static_cast<size_t>(n) == row.size()) return true;
  if (retry_eintr([&] { return write(fd, "\n", 1); }) >= 0) errno = EIO;
  return false;
}

bool rename_in(int dirfd, const std::string& from, const std::string& to) {
  return renameat(dirfd, from.c_str(), dirfd, to.c_str()) == 0;
}

bool exchange_in(int dirfd, const std::string& a, const std::string& b) {
  return renameat2(dirfd, a.c_str(), dirfd, b.c_str(), RENAME_EXCHANGE) == 0;
}

std::optional<std::vector<std::string>> names_in(int dirfd, std::string_view prefix) {
  const int fd = retry_eintr([&] { return openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  if (fd < 0) return std::nullopt;
  DIR* d = fdopendir(fd);
  if (!d) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return std::nullopt;
  }
  std::vector<std::string> out;
  while (const dirent* e = readdir(d)) {
    if (std::string_view(e->d_name).starts_with(prefix)) out.emplace_back(e->d_name);
  }
  closedir(d);
  return out;
}

bool remove_in(int dirfd, const std::string& name) { return unlinkat(dirfd, name.c_str(), 0) == 0; }

bool close_checked(UniqueFd fd) { return ::close(fd.release()) == 0; }

bool sync_data(int fd) { return retry_eintr([&] { return fdatasync(fd); }) == 0; }

bool reserve_space(int fd, std::size_t size) {
  if (retry_eintr([&] { return fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)); }) == 0) return true;
  if (errno != EOPNOTSUPP && errno != ENOSYS) return false;
  int err;
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (err == EINTR);
  errno = err;
  return err == 0;
}

bool exclusive_write_lease(int fd) { return fcntl(fd, F_SETSIG, SIGURG) == 0 && fcntl(fd, F_SETLEASE, F_WRLCK) == 0; }

std::optional<std::string> network_file_system(int fd) {
  struct statfs sfs {};
  if (fstatfs(fd, &sfs) != 0) return std::nullopt;
  return network_fs_name(static_cast<unsigned long>(sfs.f_type));
}

std::optional<std::string> network_fs_name(unsigned long f_type) {
  switch (f_type) {
    case 0x6969: return "nfs";
    case 0x517b: return "smb";
    case 0xfe534d42: return "smb2";
    case 0xff534d42: return "cifs";
    case 0x00c36400: return "ceph";
    case 0x5346414f: return "afs";
    case 0x73757245: return "coda";
    case 0x01021997: return "9p";
    case 0x564c: return "ncp";
    case 0x01161970: return "gfs2";
    case 0x7461636f: return "ocfs2";
    case 0x0bd00bd0: return "lustre";
    case 0x47504653: return "gpfs";
    default: return std::nullopt;
  }
}

LockedRange locked_range(LockAt) { return {}; }  // flock(2): the whole file, advisory

bool try_lock(int fd, bool exclusive, LockAt) {
  if (flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return true;
  if (errno == EINTR) errno = EWOULDBLOCK;
  return false;
}

bool unlock(int fd, LockAt) { return flock(fd, LOCK_UN) == 0; }

LockWait lock_until(int fd, bool exclusive, Deadline deadline, Duration tick, const std::function<void()>& on_tick) {
  const long long tick_ns = tick.count();  // the timers count nanoseconds of the monotonic clock
  const auto lock_failed = [] {
    const int err = errno;
    return LockWait{.end = LockWait::End::LockFailed, .failure = {.what = "cannot lock", .err = err}};
  };
  const auto timer_failed = [](const char* step, const char* hint) {
    const int err = errno;  // before the strings are made
    return LockWait{.end = LockWait::End::TimerFailed, .failure = {.what = step, .err = err, .hint = hint}};
  };
  const auto past = [&] { return deadline && MonotonicClock::now() >= *deadline; };
  if (past()) {
    if (try_lock(fd, exclusive)) return {LockWait::End::Locked};
    return errno == EWOULDBLOCK ? LockWait{LockWait::End::TimedOut} : lock_failed();
  }
  // The timers first, then the blocking call (which returns at once when
  // the lock is free).
  DeadlineAlarm alarm;   // the deadline
  DeadlineAlarm ticker;  // the caller's ticks
  if (deadline) {
    if (const char* step = alarm.arm(ns_of(*deadline), kRefireNs))
      return timer_failed(step, "Without it the wait would have no bound.");
  }
  // Only the ticks depend on the ticker: without one, the wait goes on without them.
  if (tick_ns > 0) (void)ticker.arm(monotonic_ns() + tick_ns, tick_ns);
  LockWait out{LockWait::End::Locked};
  const int op = exclusive ? LOCK_EX : LOCK_SH;
  while (flock(fd, op) != 0) {
    if (errno != EINTR) {
      out = lock_failed();
      break;
    }
    if (ticker.armed()) on_tick();
    if (past()) {
      // One last attempt that does not wait: a release exactly at the deadline wins.
      if (!try_lock(fd, exclusive)) out = errno == EWOULDBLOCK ? LockWait{LockWait::End::TimedOut} : lock_failed();
      break;
    }
  }
  // The ticker first: it was armed after the alarm, and gives back the alarm's handler.
  for (DeadlineAlarm* timer : {&ticker, &alarm}) {
    if (const char* step = timer->disarm(); step && out.end != LockWait::End::LockFailed) out = timer_failed(step, "");
  }
  return out;
}

}  // namespace looplock::sys
