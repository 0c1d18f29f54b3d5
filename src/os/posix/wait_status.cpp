// wait_status.hpp on POSIX.
#include "os/wait_status.hpp"

#include <sys/wait.h>

namespace looplock::sys {

std::optional<Ending> ending_of(int status) {
  if (WIFEXITED(status)) return Ending{.by_signal = false, .value = WEXITSTATUS(status)};
  if (WIFSIGNALED(status)) return Ending{.by_signal = true, .value = WTERMSIG(status)};
  return std::nullopt;
}

}  // namespace looplock::sys
