// The lock file DIR/.state.lock: opened safely (no symlinks, regular file,
// one link, trusted owner, never truncated, never deleted) and locked with
// flock(2) under a WaitPlan. After locking, the path is checked to still name
// the locked inode; if it was replaced meanwhile, the lock is retaken on the
// new file within the same deadline.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "base/policy.hpp"
#include "os/failure.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/unique_fd.hpp"

namespace looplock {

inline constexpr const char* kLockName = ".state.lock";

struct LockDir {
  std::string path;  // as the user gave it
  UniqueFd fd;       // sys::open_directory's
  sys::FileStatus st;
};

// Opens DIR. Throws Fatal 66 if it is missing or not a directory, 73 if it is
// world-writable without the sticky bit (unless `check_safety` is false, as
// for --inspect, which only reads), 71 on resource exhaustion.
LockDir open_lock_dir(const std::string& path, bool check_safety = true);
// Whether a directory with this mode lets other users swap the lock file.
bool dir_mode_unsafe(unsigned mode);

// Where the holder record (holder.hpp) lives. Where locks are advisory
// (posix/), in the lock file itself, so that one file says who holds its
// lock. Where a lock denies its bytes to every other handle (windows/:
// LockFileEx on byte 0, and other tools lock up to the first 64 KiB), the
// lock file holds no data and the record lives in DIR/.state.lock.holder,
// beside it, which no lock covers.
inline constexpr const char* kHolderName = ".state.lock.holder";
bool record_beside_lock();
// The name of the file the holder record is read from and written to.
const char* record_name();

struct LockFile {
  UniqueFd fd;
  // The holder record's own file, where it lives beside the lock file
  // (record_beside_lock()); invalid when it could not be opened for writing
  // (`record_err` says why: the run then writes no record).
  UniqueFd record;
  int record_err = 0;
  sys::FileStatus st;
  bool read_only = false;  // opened O_RDONLY: locked, but no record can be written
  int read_only_err = 0;   // why it could not be opened for writing (EACCES, EROFS, ...)
};

// The mode a new lock file (and every file looplock creates beside it: the
// incidents file) is created with, before the umask: flock(2) needs only a
// read descriptor, so whoever can open the file can take the lock.
inline constexpr unsigned kCreateMode = 0660;

// Why a run refuses a lock file (exit 73): the rule, as a run and --inspect
// both judge it.
struct Refusal {
  std::string why;    // "it has 2 hard links; a lock file must have exactly one"
  std::string hint;   // the fix
  std::string event;  // unsafe_loop_dir, unsafe_lock_file
};
// DIR itself: world-writable without the sticky bit.
std::optional<Refusal> refuse_dir(const sys::FileStatus& dir, const std::string& shown_dir);
// The lock file as found at the path (lstat): a symlink, not a regular file,
// more than one link, or owned by neither `euid` nor DIR's owner (in a DIR
// its group may write, group-writable and not sticky, a file of DIR's group
// may be any member's: every member could replace it anyway).
std::optional<Refusal> refuse_lock_file(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid,
                                        std::string_view shown_dir = "DIR");
// The same rules for another file of the lock's (`noun`: "run ledger", its
// `name` in DIR), whose refusal is the event `event` ("unsafe_run_ledger").
// `shown_dir`: DIR as the hints name it.
std::optional<Refusal> refuse_file(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid, std::string_view noun,
                                   std::string_view name, std::string_view event, std::string_view shown_dir = "DIR");

// The fix for a lock file `euid` cannot open (EACCES), by who can make it:
// DIR's owner replaces it, else its owner or root opens its mode to the group.
std::string unopenable_hint(const LockDir& dir, const sys::FileStatus& file, Uid euid,
                            const std::string& name = kLockName);

// DIR/.state.lock cannot be looked at (fstatat failed with `err`): Fatal 73
// (71 for resource exhaustion), with the fix when DIR lacks search permission.
[[noreturn]] void lock_stat_failed(const LockDir& dir, int err);

// A file of DIR locked as the lock file is (--holders' index files,
// holders.hpp): its name, and its noun and event in a refusal.
struct LockedFileRole {
  std::string name = kLockName;
  std::string_view noun = "lock file";
  std::string_view event = "unsafe_lock_file";
  // The files a permission fix names ("DIR/.state.lock.holders.*": every
  // index file at once); empty: this one.
  std::string fix_names;
};

// Opens DIR/.state.lock (or `role`'s file), creating it (kCreateMode before
// umask) if missing; read-only when it exists and the caller may not write
// it. Throws Fatal 73 if it is unsafe (refuse_lock_file, refuse_file) or
// cannot be opened, 71 on resource exhaustion.
LockFile open_lock_file(const LockDir& dir, const LockedFileRole& role = {});

enum class LockMode { Exclusive, Shared };

// Called by acquire_lock at the moments the caller reports on.
class AcquireObserver {
public:
  virtual ~AcquireObserver() = default;
  // The first attempt found the lock held and looplock is about to wait.
  virtual void on_wait(const LockFile& /*file*/) {}
  // The locked inode was no longer at the path (deleted or replaced, or DIR
  // itself was: `dir_moved`); looplock retries on the new file. `count` is
  // how many times this happened so far.
  virtual void on_replaced(int /*count*/, bool /*dir_moved*/) {}
  // While waiting: on_tick() about every tick_interval() (0: never), and
  // on_wait_end() once the wait is over, whatever its end.
  virtual Duration tick_interval() const { return Duration::zero(); }
  virtual void on_tick() {}
  virtual void on_wait_end() {}
};

struct AcquireResult {
  Acquisition status = Acquisition::Busy;
  // Acquired: the locked file. Busy/TimedOut: the file that was found held
  // (open, not locked), for reading who holds it.
  LockFile file;
  Duration waited{0};
  int replaced = 0;
};

// The descriptor the holder record of `file` is read and written through
// (-1, errno set, when its own file could not be opened).
int record_fd(const LockFile& file);

// The deadline counts from `start` (looplock passes the moment it started,
// so its own start-up is inside the deadline).
AcquireResult acquire_lock(LockDir& dir, const WaitPlan& plan, LockMode mode, AcquireObserver& observer, Instant start);

// Whether DIR/.state.lock still names the inode of `file`: nullopt (errno
// set) when that cannot be told (a failed stat other than ENOENT/ENOTDIR).
std::optional<bool> lock_path_intact(const LockDir& dir, const LockFile& file);
// Whether DIR's path still names the directory that was opened, and it has
// not been removed; nullopt (errno set) when that cannot be told.
std::optional<bool> dir_intact(const LockDir& dir);
// Both: whether the lock still protects DIR's lock file, or why that could
// not be told (the failed look, with its errno; the caller words it).
std::variant<bool, sys::Failure> lock_intact(const LockDir& dir, const LockFile& file);

}  // namespace looplock
