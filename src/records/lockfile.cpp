#include "records/lockfile.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <string>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

std::string lock_display(const LockDir& dir) {
  std::string p = dir.path;
  if (!p.empty() && p.back() != '/') p += '/';
  return p + kLockName;
}

// The hint for EACCES on a name inside DIR: DIR lacks search (x) permission
// for the caller; who can give it depends on who the caller is.
std::string search_hint(const LockDir& dir) {
  if (sys::own_euid() == dir.st.owner) {
    return "looplock needs search permission on DIR (" + dir.path + "): 'chmod u+x' it.";
  }
  return "looplock needs search permission on DIR (" + dir.path + ", uid " + std::to_string(dir.st.owner) +
         "'s, mode " + octal_mode(dir.st.mode) +
         "): run as its owner or a member of its group, or ask its owner to let yours search it (chmod g+x or o+x).";
}

std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

[[noreturn]] void refused(const LockDir& dir, const Refusal& r) {
  throw Fatal(
      exit_code::kCantCreate,
      (r.event == "unsafe_loop_dir" ? "unsafe loop directory " + dir.path : "unsafe lock file " + lock_display(dir)) +
          ": " + r.why,
      r.hint, r.event);
}

const char* const kSymlinkWhy = "it is a symbolic link (looplock never follows one)";
const char* const kSymlinkHint = "Replace it with a regular file, or remove the link and let looplock create the file.";

// Moves fd to 3 or above, so that a command started with stdin, stdout or
// stderr closed never finds the lock file there.
int above_stdio(int fd) {
  if (fd >= 3) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int err = errno;
  ::close(fd);
  errno = err;
  return moved;
}

// A monotonic one-shot timer that interrupts a blocking flock(2) with
// SIGALRM, whatever SIGALRM's inherited disposition and mask. It re-fires
// every millisecond after the deadline, so a signal that lands between the
// clock check and the next flock(2) call costs at most 1 ms. disarm() (also
// run by the destructor, which cannot report) stops it, discards pending
// timer signals and restores SIGALRM's disposition and mask. Every step is
// checked: a timer that cannot be armed would make the wait unbounded, one
// that cannot be stopped would go on firing at looplock and the command.
class DeadlineAlarm {
public:
  explicit DeadlineAlarm(long long deadline_abs_ns, long long interval_ns = 1'000'000) {
    struct sigaction sa {};
    sa.sa_handler = [](int) {};  // only there to make flock(2) return EINTR
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART
    if (sigaction(SIGALRM, &sa, &old_action_) != 0) {
      fail_errno(exit_code::kOsError, "cannot set up the deadline timer's signal", errno);
    }
    sigevent sev{};
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGALRM;
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer_) != 0) {
      int err = errno;
      sigaction(SIGALRM, &old_action_, nullptr);
      fail_errno(exit_code::kOsError, "cannot create the deadline timer", err);
    }
    itimerspec its{};
    its.it_value.tv_sec = static_cast<time_t>(deadline_abs_ns / 1'000'000'000LL);
    its.it_value.tv_nsec = static_cast<long>(deadline_abs_ns % 1'000'000'000LL);
    its.it_interval.tv_sec = static_cast<time_t>(interval_ns / 1'000'000'000LL);
    its.it_interval.tv_nsec = static_cast<long>(interval_ns % 1'000'000'000LL);
    if (timer_settime(timer_, TIMER_ABSTIME, &its, nullptr) != 0) {
      int err = errno;
      timer_delete(timer_);
      sigaction(SIGALRM, &old_action_, nullptr);
      fail_errno(exit_code::kOsError, "cannot arm the deadline timer", err, "Without it the wait would have no bound.");
    }
    armed_ = true;
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alrm, &old_mask_);
  }

  // Stops the timer for good. Throws Fatal 71 if it cannot be stopped.
  void disarm() {
    if (!armed_) return;
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
        fail_errno(exit_code::kOsError, "cannot stop the deadline timer", err);
      }
    }
    timespec zero{};
    while (sigtimedwait(&alrm, nullptr, &zero) == SIGALRM) {
    }
    // Restoring can only fail where nothing is lost: looplock's handler does
    // nothing, and the command gets the inherited state from spawn anyway.
    sigaction(SIGALRM, &old_action_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  ~DeadlineAlarm() {
    try {
      disarm();
    } catch (const Fatal&) {
      // Unwinding already, for another reason; SIGALRM stays blocked.
    }
  }

  DeadlineAlarm(const DeadlineAlarm&) = delete;
  DeadlineAlarm& operator=(const DeadlineAlarm&) = delete;

private:
  timer_t timer_{};
  bool armed_ = false;
  struct sigaction old_action_ {};
  sigset_t old_mask_{};
};

[[noreturn]] void lock_failed(const LockDir& dir, int err) {
  fail_errno(exit_code::kOsError, "cannot lock " + lock_display(dir), err,
             err == ENOLCK ? "The file system may not support flock(2) (network file system?)." : "");
}

// One non-blocking attempt: 0 when locked, EWOULDBLOCK when held elsewhere.
// EINTR counts as "held, try again later" rather than being retried here, so
// that an EINTR storm cannot keep looplock past its deadline.
int try_lock(const LockDir& dir, const LockFile& file, int op) {
  if (flock(file.fd.get(), op | LOCK_NB) == 0) return 0;
  if (errno == EWOULDBLOCK || errno == EINTR) return EWOULDBLOCK;
  lock_failed(dir, errno);
}

}  // namespace

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

std::optional<std::string> network_file_system(int fd) {
  // fstatfs(2): the one warning a run gives before it locks, when flock(2)
  // may not exclude other hosts.
  struct statfs sfs {};
  if (fstatfs(fd, &sfs) != 0) return std::nullopt;
  return network_fs_name(static_cast<unsigned long>(sfs.f_type));
}

bool dir_mode_unsafe(mode_t mode) { return (mode & S_IWOTH) && !(mode & S_ISVTX); }

std::optional<Refusal> refuse_dir(const sys::FileStatus& dir, const std::string& shown_dir) {
  if (!dir_mode_unsafe(dir.mode)) return std::nullopt;
  return Refusal{"world-writable without the sticky bit",
                 "Any user could replace the lock file there; run 'chmod o-w " + shown_dir + "' (or chmod +t).",
                 "unsafe_loop_dir"};
}

std::optional<Refusal> refuse_file(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid, std::string_view noun,
                                   std::string_view name, std::string_view event, std::string_view shown_dir) {
  const std::string n(noun);
  const std::string e(event);
  if (S_ISLNK(file.mode)) return Refusal{kSymlinkWhy, kSymlinkHint, e};
  if (!S_ISREG(file.mode)) {
    return Refusal{"it is " + file_kind(file.mode) + ", not a regular file",
                   "Move it away; looplock creates a regular file there.", e};
  }
  if (file.links > 1) {
    return Refusal{"it has " + std::to_string(file.links) + " hard links; a " + n + " must have exactly one",
                   "Another name for the same file could be swapped; replace it with a fresh regular file.", e};
  }
  // In a DIR its group may write (group-writable, not sticky), a file of
  // DIR's group may be any member's: every member could replace it anyway.
  const bool group_shared = (dir.mode & S_IWGRP) && !(dir.mode & S_ISVTX) && file.group == dir.group;
  if (file.owner != euid && file.owner != dir.owner && !group_shared) {
    const std::string dir_path(shown_dir);
    const std::string replace = "install -m 0660 -g GROUP /dev/null " + shell_word(dir_path) +
                                (dir_path.ends_with('/') ? "" : "/") + std::string(name);
    return Refusal{"it is owned by uid " + std::to_string(file.owner) + ", neither you nor DIR's owner",
                   euid == dir.owner
                       ? "As DIR's owner, replace it with one of your own while nobody holds the lock (looplock "
                         "--inspect " + shell_word(dir_path) + " says it is free): " + replace + "."
                       : "Only the caller or DIR's owner may own the " + n + " (or, in a DIR its group may write, "
                         "a member of DIR's group); ask DIR's owner (uid " + std::to_string(dir.owner) +
                         ") to replace it with one of their own, or run as DIR's owner.",
                   e};
  }
  return std::nullopt;
}

std::string unopenable_hint(const LockDir& dir, const sys::FileStatus& file, Uid euid) {
  const std::string path = lock_display(dir);
  const std::string whose = "It is uid " + std::to_string(file.owner) + "'s, mode " + octal_mode(file.mode) + ": ";
  if (euid == dir.st.owner) {
    return whose + "as DIR's owner, replace it with one of your own while nobody holds the lock (looplock --inspect " +
           shell_word(dir.path) + " says it is free): install -m 0660 -g GROUP /dev/null " + path +
           "; or its owner or root lets the group read and write it (chmod g+rw " + path + ").";
  }
  return whose + "its owner or root lets the group that shares DIR read and write it (chmod g+rw " + path +
         "), or run as a user who may open it.";
}

std::optional<Refusal> refuse_lock_file(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid,
                                        std::string_view shown_dir) {
  return refuse_file(file, dir, euid, "lock file", kLockName, "unsafe_lock_file", shown_dir);
}

LockDir open_lock_dir(const std::string& path, bool check_safety) {
  LockDir dir;
  dir.path = path;
  dir.fd.reset(sys::retry_eintr([&] { return ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); }));
  if (!dir.fd) {
    int err = errno;
    if (err == ENOENT) {
      throw Fatal(exit_code::kNoInput, "loop directory " + path + " does not exist",
                  "looplock never creates DIR; create it first, or check the path.");
    }
    if (err == ENOTDIR) {
      throw Fatal(exit_code::kNoInput, "loop directory " + path + " is not a directory",
                  "Give the loop directory, not a file in it.", "not_a_directory");
    }
    if (err == ELOOP || err == ENAMETOOLONG) {
      fail_errno(exit_code::kNoInput, "cannot open loop directory " + path, err);
    }
    fail_errno(status_for_errno(err, exit_code::kNoInput), "cannot open loop directory " + path, err);
  }
  int moved = above_stdio(dir.fd.release());
  dir.fd.reset(moved);
  if (!dir.fd) fail_errno(exit_code::kOsError, "cannot open loop directory " + path, errno);
  // Its mode (refuse_dir) and owner (refuse_lock_file), and the identity
  // dir_intact() compares against after the command.
  if (!sys::status_of_fd(dir.fd.get(), dir.st)) fail_errno(exit_code::kOsError, "cannot stat " + path, errno);
  if (check_safety) {
    if (auto r = refuse_dir(dir.st, path)) refused(dir, *r);
  }
  return dir;
}

void lock_stat_failed(const LockDir& dir, int err) {
  fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot stat " + lock_display(dir), err,
             err == EACCES ? search_hint(dir) : "");
}

LockFile open_lock_file(const LockDir& dir) {
  // A file that vanishes between our steps (nlink 0, ENOENT, EEXIST races)
  // is retried; a persistent race is reported rather than looping forever.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    sys::FileStatus pre;
    // Looked at before it is opened: a FIFO or a device must never be opened
    // (an open of either can block or have effects), a symlink is refused.
    bool exists = sys::status_at(dir.fd.get(), kLockName, pre);
    if (!exists && errno != ENOENT) lock_stat_failed(dir, errno);
    if (exists && (S_ISLNK(pre.mode) || !S_ISREG(pre.mode))) {
      refused(dir, *refuse_lock_file(pre, dir.st, sys::own_euid(), dir.path));
    }

    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
    bool read_only = false;
    int read_only_err = 0;
    int fd;
    if (!exists) {
      fd = sys::retry_eintr([&] { return openat(dir.fd.get(), kLockName, flags | O_CREAT | O_EXCL, kCreateMode); });
      if (fd < 0 && errno == EEXIST) continue;  // created meanwhile: look again
    } else {
      fd = sys::retry_eintr([&] { return openat(dir.fd.get(), kLockName, flags); });
      if (fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM || errno == ETXTBSY)) {
        read_only = true;
        read_only_err = errno;
        fd = sys::retry_eintr([&] { return openat(dir.fd.get(), kLockName, (flags & ~O_RDWR) | O_RDONLY); });
      }
      if (fd < 0 && errno == ENOENT) continue;  // deleted meanwhile
    }
    if (fd < 0) {
      int err = errno;
      if (err == ELOOP) refused(dir, Refusal{kSymlinkWhy, kSymlinkHint, "unsafe_lock_file"});
      std::string hint;
      if (err == EROFS) {
        hint = "DIR is on a read-only file system: create " + std::string(kLockName) +
               " there while it is writable (an existing lock file is locked read-only).";
      } else if (err == EACCES) {
        hint = exists ? unopenable_hint(dir, pre, sys::own_euid())
                      : "looplock must be able to create the lock file in DIR; check DIR's permissions.";
      }
      fail_errno(status_for_errno(err, exit_code::kCantCreate),
                 std::string(exists ? "cannot open " : "cannot create ") + lock_display(dir), err, hint);
    }
    LockFile f;
    f.fd.reset(above_stdio(fd));
    if (!f.fd) fail_errno(exit_code::kOsError, "cannot open " + lock_display(dir), errno);
    f.read_only = read_only;
    f.read_only_err = read_only_err;
    // What was opened (the name may have changed since the fstatat): its
    // links and owner, and the inode the lock is checked against.
    if (!sys::status_of_fd(f.fd.get(), f.st)) fail_errno(exit_code::kOsError, "cannot stat " + lock_display(dir), errno);
    if (S_ISREG(f.st.mode) && f.st.links == 0) continue;  // replaced between open and fstat
    if (auto r = refuse_lock_file(f.st, dir.st, sys::own_euid(), dir.path)) refused(dir, *r);
    return f;
  }
  throw Fatal(exit_code::kCantCreate, "cannot open " + lock_display(dir) + ": it keeps being replaced",
              "Something deletes or recreates the lock file in a loop; operators must never delete it.");
}

namespace {
// A failed stat: gone (false), or it could not be told (nullopt).
std::optional<bool> stat_failed() {
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return std::nullopt;
}
}  // namespace

std::optional<bool> lock_path_intact(const LockDir& dir, const LockFile& file) {
  sys::FileStatus now;
  if (!sys::status_at(dir.fd.get(), kLockName, now)) return stat_failed();
  return sys::same_file(now, file.st);
}

std::optional<bool> dir_intact(const LockDir& dir) {
  sys::FileStatus by_fd;
  sys::FileStatus by_path;
  if (!sys::status_of_fd(dir.fd.get(), by_fd)) return std::nullopt;
  if (by_fd.links == 0) return false;
  if (!sys::status_of_path(dir.path, by_path)) return stat_failed();
  return sys::same_file(by_fd, by_path);
}

// Three stat calls (DIR by its descriptor, for a removal; DIR by its path
// and the lock file by its name, for a replacement): a lock on a file that
// was deleted or replaced protects nothing.
IntactCheck lock_intact(const LockDir& dir, const LockFile& file) {
  IntactCheck c;
  for (auto check : {+[](const LockDir&d, const LockFile&) { return dir_intact(d); },
                     +[](const LockDir&d, const LockFile&f) { return lock_path_intact(d, f); }}) {
    errno = 0;
    auto r = check(dir, file);
    if (r && !*r) return {false, 0};
    if (!r) c.err = errno;
  }
  c.intact = c.err == 0 ? std::optional<bool>(true) : std::nullopt;
  return c;
}

AcquireResult acquire_lock(LockDir& dir, const WaitPlan& plan, LockMode mode, AcquireObserver& observer,
                           long long start_ns) {
  const int op = mode == LockMode::Exclusive ? LOCK_EX : LOCK_SH;
  const long long start = start_ns;
  const bool bounded = plan.kind == WaitPlan::Kind::Bounded;
  const long long deadline = start + plan.deadline_ns;
  std::optional<DeadlineAlarm> alarm;   // armed only when the first attempt finds the lock held
  std::optional<DeadlineAlarm> ticker;  // the observer's ticks (a status line)
  bool told_wait = false;
  // The wait is over: the timers stop (the ticker first: it was armed after
  // the alarm and restores the alarm's handler), and the observer is told.
  auto wait_over = [&] {
    if (ticker) ticker->disarm();
    if (alarm) alarm->disarm();
    if (told_wait) observer.on_wait_end();
  };

  AcquireResult result;
  for (;;) {
    LockFile file = open_lock_file(dir);
    if (try_lock(dir, file, op) != 0) {
      bool give_up = plan.kind == WaitPlan::Kind::NoWait || (bounded && sys::monotonic_ns() >= deadline);
      if (give_up) {
        result.status = plan.kind == WaitPlan::Kind::NoWait ? Acquisition::Busy : Acquisition::TimedOut;
        result.file = std::move(file);
        result.waited_ns = sys::monotonic_ns() - start;
        wait_over();
        return result;
      }
      if (!told_wait) {
        told_wait = true;
        observer.on_wait(file);
      }
      if (bounded && !alarm) alarm.emplace(deadline);
      if (const long long tick = observer.tick_interval_ns(); tick > 0 && !ticker) {
        try {
          ticker.emplace(sys::monotonic_ns() + tick, tick);
        } catch (const Fatal&) {
          // Only a status line depends on it: wait without one.
        }
      }
      for (;;) {
        if (flock(file.fd.get(), op) == 0) break;
        if (errno != EINTR) lock_failed(dir, errno);
        if (ticker) observer.on_tick();
        if (bounded && sys::monotonic_ns() >= deadline) {
          // One last non-blocking attempt: a release exactly at the deadline wins.
          if (try_lock(dir, file, op) == 0) break;
          result.status = Acquisition::TimedOut;
          result.file = std::move(file);
          result.waited_ns = sys::monotonic_ns() - start;
          wait_over();
          return result;
        }
      }
    }
    // Locked. The path must still name this inode: a lock on a file that was
    // deleted or replaced meanwhile protects nothing.
    const IntactCheck check = lock_intact(dir, file);
    if (!check.intact && check.err != 0) {
      fail_errno(exit_code::kOsError, "cannot check that " + lock_display(dir) + " is still the file locked", check.err,
                 "The command was not run.");
    }
    if (*check.intact) {
      result.status = Acquisition::Acquired;
      result.file = std::move(file);
      result.waited_ns = sys::monotonic_ns() - start;
      wait_over();
      return result;
    }
    // DIR itself was removed, moved or replaced, or only the lock file.
    const bool dir_moved = !dir_intact(dir).value_or(false);
    observer.on_replaced(++result.replaced, dir_moved);
    if (result.replaced >= 1000) {
      throw Fatal(exit_code::kCantCreate, "cannot lock " + lock_display(dir) + ": it keeps being replaced",
                  "Something deletes or recreates the lock file in a loop; operators must never delete it.");
    }
    // DIR: look it up again by its path (66 if it is gone, as for a run
    // started now).
    if (dir_moved) {
      file.fd.reset();
      dir = open_lock_dir(dir.path);
    }
    // `file` closes here, releasing the lock on the orphaned inode; retry.
  }
}

}  // namespace looplock
