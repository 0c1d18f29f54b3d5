// How a process ended, read from the status the system reports for it
// (posix/: waitpid(2)'s wait status; windows/: the process's exit code).
#pragma once

#include <optional>

namespace looplock::sys {

struct Ending {
  bool by_signal = false;  // killed by a signal (POSIX), rather than exiting
  int value = 0;           // the exit status, or the signal's number
};

// nullopt when `status` says the process has not ended (it stopped).
std::optional<Ending> ending_of(int status);

}  // namespace looplock::sys
