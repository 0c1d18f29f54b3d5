// What a hold across steps (--hold, --release) asks of the system: a holder
// process detached from the caller (its own session, stdio on /dev/null,
// working directory /) that reports once it holds the lock; the sentinel
// that stands in for a command while the hold lasts; and a process named by
// its pid and start time, signalled and waited for without a pid reused in
// between ever being hit. posix/hold_process.cpp implements it (pidfd_open(2),
// signalfd(2)); windows/: ENOSYS throughout (abilities().hold is false).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "os/ids.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

// fork(2) for --hold. In the parent: the child's pid and the read end of its
// report pipe. In the child (pid 0): the write end (at descriptor 3 or
// above); the child is the leader of a session of its own, its working
// directory is /, its stdin and stdout are /dev/null, its stderr is still
// the caller's (until quiet_stderr()), and it keeps no other descriptor of
// the caller's. nullopt (errno set) when it cannot be done.
struct Detached {
  Pid pid = 0;
  UniqueFd report;
};
std::optional<Detached> detach_holder();

// The holder, holding the lock: its stderr onto /dev/null too.
bool quiet_stderr();

// The parent: what the child reported, or how it ended without a report.
// While it waits, TERM, INT and HUP sent to the parent are passed to the
// child as TERM (it then stops waiting or lets go); `signal` says which
// came, 0 if none. The line goes to `deliver` while those signals (and
// SIGPIPE) are still held back; when it returns an errno other than 0, the
// child is ended (stop_holder()) and `deliver_err` says why.
struct HolderReport {
  std::optional<std::string> line;  // the child's line (it holds the lock)
  int wait_status = 0;              // without a line: the child's wait status
  int signal = 0;
  int deliver_err = 0;
  bool tie_ended = false;
};
// `tie`: a handle (PinnedProcess::handle()) whose end ends the wait too
// (the child is told to end; `tie_ended` says so), or -1.
HolderReport await_holder(Pid child, int report_fd, int tie, const std::function<int(const std::string&)>& deliver);

// The parent: ends its holder (TERM: a waiting holder stops waiting, a
// holding one lets go) and waits for it to exit.
void stop_holder(Pid child);

// The sentinel, the holder's command: blocks until TERM, INT or HUP
// arrives, its holder (its parent) ends, or, when `tied_to` is not 0, that
// process (which must have the start time `tied_start`) has ended; returns
// 0 then, 1 at once when the tie or the holder is already gone, 71 when the
// system cannot watch them or listen for steps. Once it listens it writes
// `report_line` to `report_fd` (the caller prints it), and from then on
// hands the lock's descriptor `lock_fd` (inherited from the holder) to a
// later step that proves it knows the secret whose SHA-256 is
// `secret_sha256` (posix/: over an abstract Unix socket whose name is
// derived from the secret, SCM_RIGHTS), so that the step's command holds the
// lock through a descriptor of its own, as under any looplock.
struct SentinelSpec {
  Pid holder = 0;
  int lock_fd = -1;
  int report_fd = -1;
  std::string report_line;
  std::string secret_sha256;
  std::string socket_key;  // the socket's name (from the secret)
  Pid tied_to = 0;
  std::string tied_start;
  // "NAME=value" lines handed over with the descriptor (the cluster lock's
  // key, lease and fencing token, as the holder exported them).
  std::string exports;
};
// The sentinel's status when it ended while steps that it handed the
// descriptor to were still connected: they hold the lock through it, and
// with --etcd renew the hold's lease themselves, so the holder lets go
// without revoking that lease (it expires once no step renews it).
inline constexpr int kSentinelStepsInside = 2;
int hold_sentinel(const SentinelSpec& spec);

// The socket name's key for a hold's secret (the same on both sides).
std::string hold_socket_key(std::string_view secret);

// A later step: the descriptor the hold's sentinel hands over for `secret`,
// and its exports, once the peer is confirmed to be a child of the holder
// `holder` (which has the start time `holder_start`) running as the same
// user; an invalid fd (errno set) when it cannot be had.
// `conn`: the connection to the sentinel, which the step keeps open while
// it runs (close-on-exec: never its command's): while a step is connected,
// the sentinel's end does not end the hold's lease (kSentinelStepsInside),
// and a hold ended by its tie says so on it ("E").
struct HoldShare {
  UniqueFd fd;
  std::string exports;
  UniqueFd conn;
};
HoldShare fetch_hold_fd(Pid holder, const std::string& holder_start, std::string_view secret);
// Whether the sentinel said, on a step's connection `conn`, that the hold
// has ended by its tie ("E"; never blocks). A connection the sentinel
// closed without it (--release, a holder KILLed) is no such end.
bool hold_tie_ended(int conn);

// Whether the system has pidfds (posix/: pidfd_open(2), Linux 5.3).
bool pidfds_available();

// A process pinned by a handle (posix/: a pidfd) once its start time is
// confirmed: signals and waits reach it and never a later process given the
// same pid.
class PinnedProcess {
public:
  // nullopt (errno set: ESRCH when there is no such process or it has
  // another start time) when it cannot be pinned.
  static std::optional<PinnedProcess> pin(Pid pid, const std::string& start);
  // TERM through the handle; false (errno set) on failure.
  bool terminate() const;
  // Waits until it has ended, at most `bound`; true once it has.
  bool wait_end(std::chrono::milliseconds bound) const;
  // The handle, readable once the process has ended (posix/: the pidfd).
  int handle() const { return fd_.get(); }

private:
  explicit PinnedProcess(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// The absolute path of process `pid`'s executable (posix/: /proc/PID/exe),
// nullopt when it cannot be read (another user's process, no /proc).
std::optional<std::string> process_executable(Pid pid);

}  // namespace looplock::sys
