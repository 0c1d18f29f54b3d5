#include "records/lockfile.hpp"

#include <cerrno>
#include <string>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

std::string lock_display(const LockDir& dir) { return sys::path_in_dir(dir.path, kLockName); }

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

std::string file_kind(const sys::FileStatus& st) {
  if (st.directory()) return "a directory";
  if (st.fifo()) return "a FIFO";
  if (st.socket()) return "a socket";
  if (st.char_device()) return "a character device";
  if (st.block_device()) return "a block device";
  if (st.symlink()) return "a symbolic link";
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

[[noreturn]] void lock_failed(const LockDir& dir, int err) {
  fail_errno(exit_code::kOsError, "cannot lock " + lock_display(dir), err,
             err == ENOLCK ? "The file system may not support flock(2) (network file system?)." : "");
}

// One attempt that does not wait: whether it locked (an interrupted attempt
// counts as "held, try again later", so that interruptions cannot keep
// looplock past its deadline).
bool try_lock(const LockDir& dir, const LockFile& file, LockMode mode) {
  if (sys::try_lock(file.fd.get(), mode == LockMode::Exclusive)) return true;
  if (errno != EWOULDBLOCK) lock_failed(dir, errno);
  return false;
}

}  // namespace

bool dir_mode_unsafe(unsigned mode) { return (mode & sys::mode::kOtherWrite) && !(mode & sys::mode::kSticky); }

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
  if (file.symlink()) return Refusal{kSymlinkWhy, kSymlinkHint, e};
  if (!file.regular()) {
    return Refusal{"it is " + file_kind(file) + ", not a regular file",
                   "Move it away; looplock creates a regular file there.", e};
  }
  if (file.links > 1) {
    return Refusal{"it has " + std::to_string(file.links) + " hard links; a " + n + " must have exactly one",
                   "Another name for the same file could be swapped; replace it with a fresh regular file.", e};
  }
  // In a DIR its group may write (group-writable, not sticky), a file of
  // DIR's group may be any member's: every member could replace it anyway.
  const bool group_shared =
      (dir.mode & sys::mode::kGroupWrite) && !(dir.mode & sys::mode::kSticky) && file.group == dir.group;
  if (file.owner != euid && file.owner != dir.owner && !group_shared) {
    const std::string dir_path(shown_dir);
    // Windows: no mode, no group to give it; taking ownership is the fix.
    const std::string path = shell_word(sys::path_in_dir(dir_path, name));
    const std::string replace =
        sys::abilities().permission_bits ? "install -m 0660 -g GROUP /dev/null " + path : "takeown /f " + path;
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

std::string unopenable_hint(const LockDir& dir, const sys::FileStatus& file, Uid euid, const std::string& name) {
  const std::string path = sys::path_in_dir(dir.path, name);
  const std::string whose = "It is uid " + std::to_string(file.owner) + "'s, mode " + octal_mode(file.mode) + ": ";
  if (!sys::abilities().permission_bits) {  // Windows: access is by ACL
    return "its owner or an administrator lets you read and write it (icacls " + path +
           " /grant %USERNAME%:M), or run as a user who may open it.";
  }
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
  dir.fd = sys::open_directory(path);
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
      fail_errno(exit_code::kNoInput, "cannot open loop directory " + path, err,
                 err == ELOOP ? "Its path holds a loop of symbolic links; give the directory's real path."
                              : "Its path is longer than the system opens at once; cd to a directory above it and "
                                "give a shorter relative path.",
                 "dir_path_unusable");
    }
    fail_errno(status_for_errno(err, exit_code::kNoInput), "cannot open loop directory " + path, err);
  }
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

bool record_beside_lock() { return !sys::abilities().advisory_locks; }

const char* record_name() { return record_beside_lock() ? kHolderName : kLockName; }

int record_fd(const LockFile& file) {
  if (!record_beside_lock()) return file.fd.get();
  if (!file.record) errno = file.record_err ? file.record_err : EBADF;
  return file.record ? file.record.get() : -1;
}

namespace {

// The record file `st` under the lock file's rules: refused (73) as
// --inspect's survey refuses it.
void refuse_record_file(const LockDir& dir, const sys::FileStatus& st) {
  if (auto r = refuse_file(st, dir.st, sys::own_euid(), "holder record", kHolderName, "unsafe_lock_file", dir.path)) {
    r->why = std::string(kHolderName) + " beside it: " + r->why;  // the message names the lock file
    refused(dir, *r);
  }
}

// DIR/.state.lock.holder, where the record lives beside the lock file: under
// the lock file's rules (a regular file, no link, one hard link, a trusted
// owner), refused (73) otherwise, whether it opened or not (a directory
// there does not open); opened for writing, or not at all (errno set: the
// run then writes no record).
UniqueFd open_record_file(const LockDir& dir) {
  UniqueFd fd = sys::open_in(dir.fd.get(), kHolderName,
                             {.access = sys::OpenIn::Access::ReadWrite,
                              .create = sys::OpenIn::Create::IfMissing,
                              .mode = kCreateMode,
                              .above_stdio = true,
                              .keep_name = true});
  if (!fd && errno == ELOOP) {
    refused(dir, Refusal{std::string(kHolderName) + " beside it is a symbolic link (looplock never follows one)",
                         kSymlinkHint, "unsafe_lock_file"});
  }
  sys::FileStatus st;
  if (!fd) {
    const int err = errno;
    if (sys::status_at(dir.fd.get(), kHolderName, st)) refuse_record_file(dir, st);
    errno = err;
    return fd;
  }
  if (!sys::status_of_fd(fd.get(), st)) fail_errno(exit_code::kOsError, "cannot stat " + lock_display(dir), errno);
  refuse_record_file(dir, st);
  return fd;
}

}  // namespace

LockFile open_lock_file(const LockDir& dir, const LockedFileRole& role) {
  const std::string shown = sys::path_in_dir(dir.path, role.name);
  auto refusal = [&](const sys::FileStatus& st) {
    return refuse_file(st, dir.st, sys::own_euid(), role.noun, role.name, role.event, dir.path);
  };
  auto refuse = [&](const Refusal& r) {
    if (role.name == kLockName) refused(dir, r);
    throw Fatal(exit_code::kCantCreate, "unsafe " + std::string(role.noun) + " " + shown + ": " + r.why, r.hint,
                r.event);
  };
  // A file that vanishes between our steps (nlink 0, ENOENT, EEXIST races)
  // is retried; a persistent race is reported rather than looping forever.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    sys::FileStatus pre;
    // Looked at before it is opened: a FIFO or a device must never be opened
    // (an open of either can block or have effects), a symlink is refused.
    bool exists = sys::status_at(dir.fd.get(), role.name.c_str(), pre);
    if (!exists && errno != ENOENT) lock_stat_failed(dir, errno);
    if (exists && !pre.regular()) {
      refuse(*refusal(pre));
    }

    sys::OpenIn how{.access = sys::OpenIn::Access::ReadWrite,
                    .create = exists ? sys::OpenIn::Create::No : sys::OpenIn::Create::New,
                    .mode = kCreateMode,
                    .above_stdio = true,
                    .keep_name = true};
    bool read_only = false;
    int read_only_err = 0;
    UniqueFd fd = sys::open_in(dir.fd.get(), role.name, how);
    if (!exists && !fd && errno == EEXIST) continue;  // created meanwhile: look again
    if (exists && !fd && (errno == EACCES || errno == EROFS || errno == EPERM || errno == ETXTBSY)) {
      read_only = true;
      read_only_err = errno;
      how.access = sys::OpenIn::Access::Read;
      fd = sys::open_in(dir.fd.get(), role.name, how);
    }
    if (exists && !fd && errno == ENOENT) continue;  // deleted meanwhile
    if (!fd) {
      int err = errno;
      if (err == ELOOP) refuse(Refusal{kSymlinkWhy, kSymlinkHint, std::string(role.event)});
      std::string hint;
      if (err == EROFS) {
        hint = "DIR is on a read-only file system: create " + role.name + " there while it is writable (an existing " +
               std::string(role.noun) + " is locked read-only).";
      } else if (err == EACCES) {
        hint = exists ? unopenable_hint(dir, pre, sys::own_euid(), role.fix_names.empty() ? role.name : role.fix_names)
                      : "looplock must be able to create the " + std::string(role.noun) +
                            " in DIR; check DIR's permissions.";
      }
      fail_errno(status_for_errno(err, exit_code::kCantCreate),
                 std::string(exists ? "cannot open " : "cannot create ") + shown, err, hint);
    }
    LockFile f;
    f.fd = std::move(fd);
    f.read_only = read_only;
    f.read_only_err = read_only_err;
    // What was opened (the name may have changed since the fstatat): its
    // links and owner, and the inode the lock is checked against.
    if (!sys::status_of_fd(f.fd.get(), f.st)) fail_errno(exit_code::kOsError, "cannot stat " + shown, errno);
    if (f.st.regular() && f.st.links == 0) continue;  // replaced between open and fstat
    if (auto r = refusal(f.st)) refuse(*r);
    if (role.name == kLockName && record_beside_lock() && !(f.record = open_record_file(dir))) f.record_err = errno;
    return f;
  }
  throw Fatal(exit_code::kCantCreate, "cannot open " + shown + ": it keeps being replaced",
              "Something deletes or recreates the " + std::string(role.noun) +
                  " in a loop; operators must never "
                  "delete it.");
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
std::variant<bool, sys::Failure> lock_intact(const LockDir& dir, const LockFile& file) {
  std::optional<sys::Failure> unknown;
  for (auto check : {+[](const LockDir&d, const LockFile&) { return dir_intact(d); },
                     +[](const LockDir&d, const LockFile&f) { return lock_path_intact(d, f); }}) {
    errno = 0;
    auto r = check(dir, file);
    if (r && !*r) return false;
    if (!r) {
      const int err = errno;  // before the strings are made
      unknown =
          sys::Failure{.what = "cannot check that " + lock_display(dir) + " is still the file locked", .err = err};
    }
  }
  if (unknown) return *unknown;
  return true;
}

AcquireResult acquire_lock(LockDir& dir, const WaitPlan& plan, LockMode mode, AcquireObserver& observer,
                           Instant start) {
  const bool bounded = plan.kind == WaitPlan::Kind::Bounded;
  const Instant deadline = later(start, plan.timeout);
  bool told_wait = false;
  AcquireResult result;
  // The wait is over, whatever its end: the observer is told.
  auto over = [&](Acquisition status, LockFile file) {
    result.status = status;
    result.file = std::move(file);
    result.waited = MonotonicClock::now() - start;
    if (told_wait) observer.on_wait_end();
    return std::move(result);
  };

  for (;;) {
    LockFile file = open_lock_file(dir);
    if (!try_lock(dir, file, mode)) {
      if (plan.kind == WaitPlan::Kind::NoWait) return over(Acquisition::Busy, std::move(file));
      if (bounded && MonotonicClock::now() >= deadline) return over(Acquisition::TimedOut, std::move(file));
      if (!told_wait) {
        told_wait = true;
        observer.on_wait(file);
      }
      const auto wait =
          sys::lock_until(file.fd.get(), mode == LockMode::Exclusive, bounded ? Deadline(deadline) : std::nullopt,
                          observer.tick_interval(), [&] { observer.on_tick(); });
      switch (wait.end) {
        case sys::LockWait::End::Locked: break;
        case sys::LockWait::End::TimedOut: return over(Acquisition::TimedOut, std::move(file));
        case sys::LockWait::End::LockFailed: lock_failed(dir, wait.failure.err);
        case sys::LockWait::End::TimerFailed: fail(exit_code::kOsError, wait.failure);
      }
    }
    // Locked. The path must still name this inode: a lock on a file that was
    // deleted or replaced meanwhile protects nothing.
    const auto check = lock_intact(dir, file);
    if (const auto* f = std::get_if<sys::Failure>(&check)) {
      fail(exit_code::kOsError, {.what = f->what, .err = f->err, .hint = "The command was not run."});
    }
    if (std::get<bool>(check)) return over(Acquisition::Acquired, std::move(file));
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
