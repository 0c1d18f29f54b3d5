// wait_status.hpp on Windows: the status is GetExitCodeProcess's exit code,
// whole (an NTSTATUS such as 0xC0000005 included); no process ends by a
// signal there.
#include "os/wait_status.hpp"

namespace looplock::sys {

std::optional<Ending> ending_of(int status) { return Ending{.by_signal = false, .value = status}; }

}  // namespace looplock::sys
