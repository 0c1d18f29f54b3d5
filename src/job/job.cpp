#include "job/job.hpp"

#include "base/exit_codes.hpp"
#include "os/wait_status.hpp"

namespace looplock {

int shell_status(int status) {
  const auto ending = sys::ending_of(status);
  if (!ending) return exit_code::kOsError;
  return ending->by_signal ? 128 + ending->value : ending->value;
}

}  // namespace looplock
