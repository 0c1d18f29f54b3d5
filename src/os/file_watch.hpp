// Waking when another process lets go of a file: --holders' waiters
// (records/holders.hpp) sleep until a holder closes its index file, which
// releases its lock on it. posix/: inotify(7)'s IN_CLOSE on each file
// (a process's death closes its descriptors too); windows/: no watch (the
// caller's bounded wait is its poll). Waiters keep their own descriptors of
// the files open for the whole wait, so that they never wake each other.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "os/clock.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

class CloseWatch {
public:
  // Watches `names` in the directory `dirfd`; a file that cannot be watched
  // (no inotify, its limit reached) leaves the watch to its bound. With
  // `absorb_alarm` (a timed wait), SIGALRM only cuts a wait short until the
  // watch ends, as it does in a timed wait for a lock (files.hpp).
  CloseWatch(int dirfd, const std::vector<std::string>& names, bool absorb_alarm);
  ~CloseWatch();
  CloseWatch(const CloseWatch&) = delete;
  CloseWatch& operator=(const CloseWatch&) = delete;
  // Returns once one of the files was closed by a process, or after
  // `at_most`, or at once when a signal arrives.
  void wait(Duration at_most);

private:
  struct Alarm;  // the disposition of SIGALRM to restore
  UniqueFd fd_;
  std::unique_ptr<Alarm> alarm_;
};

}  // namespace looplock::sys
