// Waking when another process lets go of a file: --holders' waiters
// (records/holders.hpp) sleep until a holder closes its index file, which
// releases its lock on it. posix/: inotify(7)'s IN_CLOSE on each file
// (a process's death closes its descriptors too); windows/: no watch (the
// caller's bounded wait is its poll). Waiters keep their own descriptors of
// the files open for the whole wait, so that they never wake each other.
#pragma once

#include <string>
#include <vector>

#include "os/clock.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

class CloseWatch {
public:
  // Watches `names` in the directory `dirfd`; a file that cannot be watched
  // (no inotify, its limit reached) leaves the watch to its bound.
  CloseWatch(int dirfd, const std::vector<std::string>& names);
  // Returns once one of the files was closed by a process, or after
  // `at_most`, or at once when a signal arrives.
  void wait(Duration at_most);

private:
  UniqueFd fd_;
};

}  // namespace looplock::sys
