// Files in a directory that others share, and the locks on them: what the
// lock file, the run ledger, the incidents file and the metrics files ask
// of the system. A file is reached through its directory's descriptor and a
// name, never through a symbolic link at that name; it is never opened as
// a controlling terminal nor waited on (a FIFO), and no descriptor of these
// is inherited by a command. posix/files.cpp: openat(2) with O_NOFOLLOW,
// O_NOCTTY, O_NONBLOCK and O_CLOEXEC, and flock(2). Each call returns false
// or an invalid UniqueFd with errno set when it fails, as sys.hpp's do.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/clock.hpp"
#include "os/failure.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

// Opens the directory `path` to reach the files in it (posix/: O_PATH |
// O_DIRECTORY), at descriptor 3 or above: a command started with stdin,
// stdout or stderr closed must never find it there. ENOENT when there is
// none, ENOTDIR when it is not a directory.
UniqueFd open_directory(const std::string& path);

// How open_in opens a file.
struct OpenIn {
  enum class Access { Read, Write, ReadWrite };
  enum class Create {
    No,         // ENOENT when it is missing
    IfMissing,  // created when missing
    New,        // created; EEXIST when it exists
  };
  Access access = Access::Read;
  Create create = Create::No;
  unsigned mode = 0;         // a created file's mode, before the umask
  bool append = false;       // every write goes to its end
  bool truncate = false;     // emptied as it is opened
  bool above_stdio = false;  // at descriptor 3 or above (see open_directory)
  // Nobody may delete or rename the file while it is open (windows/: not
  // shared for delete; posix/: no such rule, the name is checked instead).
  bool keep_name = false;
};
// Opens `name` in the directory `dirfd` (ELOOP when the name is a symbolic
// link).
UniqueFd open_in(int dirfd, const std::string& name, const OpenIn& how);

// What the caller may do with `name` in the directory `dirfd` ("." for the
// directory itself), by its effective ids and groups, judging the name
// itself, not a link's target: false (errno set: EACCES, or EROFS when
// only a read-only file system forbids it) when it may not do all that
// `want` asks. posix/: faccessat(2) with AT_EACCESS; windows/: its
// read-only attribute only (access there is by ACL).
struct Permission {
  bool read = false;
  bool write = false;
  bool search = false;  // a directory's
};
bool may_access(int dirfd, const std::string& name, Permission want);

// Appends `row` to `fd` (opened to append) in one write, so that the rows
// of processes appending at once never mix. A write that comes short (a
// full disk, a file-size limit) has its damaged line ended with a newline
// when the file takes one more byte: false then, with errno EIO, or the
// errno of that last write (which says why).
bool append_row(int fd, std::string_view row);

// Renames `from` to `to` in the directory `dirfd`, replacing `to`.
bool rename_in(int dirfd, const std::string& from, const std::string& to);
// Swaps the files named `a` and `b` in `dirfd` in one step (posix/:
// renameat2(RENAME_EXCHANGE)); ENOENT when either is missing, EINVAL or
// ENOSYS when the system or the file system cannot.
bool exchange_in(int dirfd, const std::string& a, const std::string& b);
// The names in the directory `dirfd` that start with `prefix` (posix/:
// readdir(3) of a descriptor opened on it; windows/: FindFirstFileW), or
// nullopt (errno set) when it cannot be listed.
std::optional<std::vector<std::string>> names_in(int dirfd, std::string_view prefix);
// Removes the file `name` from `dirfd`.
bool remove_in(int dirfd, const std::string& name);
// Closes `fd`, saying whether the close succeeded: a file system may report
// a failed write only then (NFS).
bool close_checked(UniqueFd fd);
// Makes what was written to `fd` durable (posix/: fdatasync(2); windows/:
// _commit); false (errno set) on failure.
bool sync_data(int fd);
// Reserves the blocks for the first `size` bytes of `fd` without changing
// its size, so that a write of that much cannot fail for want of space
// (posix/: fallocate(2) with FALLOC_FL_KEEP_SIZE; where the file system
// cannot, posix_fallocate(3), which extends the file with NUL bytes).
bool reserve_space(int fd, std::size_t size);
// Takes a lease that proves no other descriptor has `fd`'s file open, and
// makes any open of it wait until `fd` is closed (posix/: F_SETLEASE
// F_WRLCK, its break signalled with URG, which is ignored by default);
// false when it cannot be had (another holds the file, or no leases here).
bool exclusive_write_lease(int fd);
// The name of the network file system `fd` is on ("nfs", "cifs", ...), or
// nullopt for a local one: a lock there may not exclude other hosts.
std::optional<std::string> network_file_system(int fd);

// Locks on a whole file, held by the open file (posix/: flock(2): every
// descriptor of that open file description shares it; it is released when
// the last one closes).
//
// On a system whose locks are byte ranges (windows/: LockFileEx), which
// byte a lock covers: byte 0, the one the C runtime's _locking (Python's
// msvcrt.locking) takes at the start of a file, so that other tools'
// holders and looplock exclude each other; or, for a file that others read
// while an appender holds its lock (the incidents file), a byte past any
// data a file holds, since there such a lock denies every other handle
// the bytes it covers (posix/: flock(2) locks the whole file, advisory,
// either way).
enum class LockAt { Start, PastData };
// The range a lock at `at` covers, for the tests of the layout: its offset
// and length in bytes (posix/: 0 and 0, the whole file, no byte denied).
struct LockedRange {
  unsigned long long offset = 0;
  unsigned long long length = 0;
};
LockedRange locked_range(LockAt at);

// One attempt that does not wait: true when locked; false with errno
// EWOULDBLOCK when another holds it (an interrupted attempt counts as that,
// so that interruptions cannot keep the caller past its deadline).
bool try_lock(int fd, bool exclusive, LockAt at = LockAt::Start);
// Releases `fd`'s lock.
bool unlock(int fd, LockAt at = LockAt::Start);

// How a wait for a lock ended.
struct LockWait {
  enum class End {
    Locked,
    TimedOut,     // the deadline came first
    LockFailed,   // the lock could not be taken: `failure` says why
    TimerFailed,  // the deadline's timer could not be set up (the wait would have no bound) or stopped
  };
  End end = End::Locked;
  // LockFailed, TimerFailed: the step that failed ("cannot arm the deadline
  // timer") and its errno.
  Failure failure{};
};
// Waits for the lock on `fd` until the monotonic clock reaches `deadline`
// (none: for ever), calling `on_tick` about every `tick` while it waits (0:
// never). A lock released exactly at the
// deadline is still taken. posix/: a blocking flock(2) that a timer ends
// with SIGALRM, whatever SIGALRM's inherited disposition and mask, which
// are given back before it returns. windows/: a blocking LockFileEx in a
// thread of its own, on a duplicate of `fd`'s handle; at the deadline that
// thread is left waiting, and releases at once a lock granted to it later.
LockWait lock_until(int fd, bool exclusive, Deadline deadline, Duration tick, const std::function<void()>& on_tick);

}  // namespace looplock::sys
