// What looplock asks of the operating system in small: writes and reads,
// clocks, random numbers, its own pid and start time, paths, names. posix/
// and windows/ implement it (sys.cpp: what both share); on POSIX the calls
// are EINTR-safe. The deadline wait is not here: there EINTR must consult
// the clock (records/lockfile.cpp).
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/ids.hpp"
#include "os/interrupts.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

template <typename F>
auto retry_eintr(F&& f) {
  decltype(f()) r;
  do {
    r = f();
  } while (r == -1 && errno == EINTR);
  return r;
}

// Calls f(line) for each line of `text` (without its '\n'; a last line
// without one counts too).
template <typename F>
void for_each_line(std::string_view text, F&& f) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    f(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

// The signals that end a wait (INT, TERM, HUP, QUIT), held back while a
// coalescing waiter sits in its seat, so that it can say what it absorbed
// before one ends it (posix/: blocked, then looked for as pending; Windows
// has none: nothing is held and none is ever pending).
bool hold_ending_signals();          // false (errno set) when they cannot be blocked
void let_ending_signals_through();   // unblocks them: a pending one is delivered now
int pending_ending_signal();         // the first of them that is pending, or 0
const Interrupts& ending_interrupts();  // the same set, to end a wait early (os/interrupts.hpp)

// Writes all of `data`; returns false (errno set) on failure.
bool write_all(int fd, std::string_view data);
// Writes all of `data` at `offset` of `fd` (its start by default; pwrite:
// the file offset stays); returns false (errno set) on failure.
bool pwrite_all(int fd, std::string_view data, long long offset = 0);

// Cuts the file open as `fd` to `size` bytes; false (errno set) on failure.
bool truncate_fd(int fd, long long size);

// Reads up to `limit` bytes from `offset` (its start by default) of `fd`, a
// regular file (pread; a short read is its end). nullopt on error.
std::optional<std::string> pread_all(int fd, size_t limit, long long offset = 0);

// One read of up to `size` bytes at `offset` of `fd` (pread; short at the
// file's end); nullopt (errno set) on error.
std::optional<std::string> pread_some(int fd, size_t size, long long offset);

// Reads a whole (small) file such as /proc/PID/stat. nullopt on error, errno set.
std::optional<std::string> read_file(const std::string& path, size_t limit = 1 << 20);

// Milliseconds on CLOCK_MONOTONIC.
long long monotonic_ms();
// Nanoseconds on CLOCK_MONOTONIC.
long long monotonic_ns();

// "2026-11-30T17:00:00.123Z" for the current time (CLOCK_REALTIME, UTC).
std::string utc_now_iso8601();
// The same for `ms` milliseconds since the epoch.
std::string utc_iso8601(long long ms);
// Milliseconds since the epoch for "2026-11-30T17:00:00.123Z" (exactly that
// form); nullopt otherwise.
std::optional<long long> parse_utc_ms(const std::string& iso);
// Milliseconds since the epoch for the current time.
long long realtime_ms();

// Sleeps for `ns`, or less when a signal arrives (posix/: one nanosleep(2);
// windows/: Sleep, rounded up to whole milliseconds): a pause between tries.
void nap_ns(long long ns);
// Sleeps until CLOCK_MONOTONIC reaches `until_ns` (EINTR: sleeps on).
void sleep_until_ns(long long until_ns);
// A uniformly random number in [0, bound) from getrandom(2) (bound > 0);
// nullopt (errno set) when the kernel gives none.
std::optional<unsigned long long> random_below(unsigned long long bound);

// `name` in the directory `dir`, joined as the system writes a path
// (posix/: '/'; windows/: '\\'), with no separator doubled.
std::string path_in_dir(std::string_view dir, std::string_view name);
// Whether `c` separates the parts of a path (posix/: '/'; windows/: '/' and
// '\\').
bool is_path_separator(char c);

// The suffix the system's programs are named with (posix/: none; windows/:
// ".exe"), which a program's name for looplock leaves out.
std::string_view program_suffix();

// What this system has that some of looplock's options need (posix/: all
// of it; windows/: none of it, so those options are usage errors there).
struct Abilities {
  bool exec = false;            // a process replaced by a program (-F)
  bool signals = false;         // signals to warn a job with (--warn-before, --warn-signal)
  bool inherited_lock = false;  // a command that holds the lock through an inherited descriptor ($LOOPLOCK_FD)
  bool cluster = false;         // the etcd helper and its transport (--etcd)
  // A locked file's bytes stay readable and writable through other handles
  // (posix/: flock(2) is advisory; windows/: a LockFileEx lock denies its
  // bytes to every other handle, even of the same process).
  bool advisory_locks = false;
  // A file's mode says who may read and write it: owner, group, others
  // (posix/; windows/: access is by ACL, and a mode has the owner's bits only).
  bool permission_bits = false;
  // Names of files and programs differ by case (posix/; windows/: Python.exe
  // is python.exe).
  bool case_sensitive_names = false;
  // A relay process for --notify's notifiers (os/relay.hpp).
  bool notify = false;
  // Up to N holders of one lock (--holders): index files beside the lock
  // file, waited for by watching them (posix/: inotify).
  bool holders = false;
  // A hold across steps (--hold, --release): a detached holder, and
  // processes pinned by a handle (posix/: pidfd_open(2)).
  bool hold = false;
};
Abilities abilities();

// This process's id (process.hpp: its start time).
Pid own_pid();
// This process's real and effective user ids (windows/: 0, since Windows
// names users by SID, not by number).
Uid own_uid();
Uid own_euid();
// Whether this process belongs to group `gid`, as its effective group or a
// supplementary one (windows/: never: groups there have no number).
bool in_group(Gid gid);

// The absolute path of this process's own executable (posix/: one
// readlink(2) of /proc/self/exe; windows/: GetModuleFileName); nullopt
// when it cannot be told.
std::optional<std::string> own_executable();
// Whether this process may execute `path`: 0, or why not as an errno
// (ENOENT: it sees no such file; posix/: access(2)).
int execute_access(const std::string& path);
// Replaces this process with the program at `path`, given `argv` and the
// environment `env` ("NAME=value" each); returns only when it cannot, with
// the errno (posix/: execve(2); windows/: ENOSYS, Windows has no exec).
int exec_program(const std::string& path, char** argv, const std::vector<std::string>& env);

// The absolute path the system knows an open file or directory by (posix/:
// one readlink(2) of /proc/self/fd/N; windows/: GetFinalPathNameByHandle);
// nullopt when it has none (it was removed) or it cannot be read.
std::optional<std::string> path_of_fd(int fd);
// `path` made absolute with every link resolved (realpath(3)); nullopt
// (errno set) when it cannot be.
std::optional<std::string> real_path(const std::string& path);
// The working directory; nullopt when it cannot be read.
std::optional<std::string> working_dir();

// Whether `fd` is a terminal (posix/: isatty(3)), and its width in columns
// when the system says (posix/: TIOCGWINSZ).
bool is_terminal(int fd);
std::optional<int> terminal_width(int fd);
// Keeps `fd` from the commands this process starts (posix/: FD_CLOEXEC;
// windows/: the handle made not inheritable); false (errno set) when it cannot.
bool keep_from_commands(int fd);

// Opens `path` for reading only: never as a controlling terminal, without
// waiting on a FIFO, not inherited by the command. An invalid UniqueFd
// (errno set) when it cannot be opened.
UniqueFd open_for_reading(const std::string& path);

// This host's name (gethostname(2)), or "unknown".
std::string host_name();

// The name of user `uid` as /etc/passwd lists it (one read), else the
// number. Never NSS (getpwuid(3)): a static program cannot load its modules.
std::string user_name(Uid uid);

}  // namespace looplock::sys
