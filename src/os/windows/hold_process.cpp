// Windows has no hold across steps yet (abilities().hold is false): no
// detached holder, no sentinel, no pinned process.
#include <cerrno>

#include "os/hold_process.hpp"

namespace looplock::sys {

std::optional<Detached> detach_holder() {
  errno = ENOSYS;
  return std::nullopt;
}

bool report_held(UniqueFd /*report*/, std::string_view /*line*/) {
  errno = ENOSYS;
  return false;
}

HolderReport await_holder(Pid /*child*/, int /*report_fd*/) { return {}; }

int hold_sentinel(Pid /*tied_to*/, std::string_view /*tied_start*/) { return 71; }

std::optional<PinnedProcess> PinnedProcess::pin(Pid /*pid*/, const std::string& /*start*/) {
  errno = ENOSYS;
  return std::nullopt;
}

bool PinnedProcess::terminate() const {
  errno = ENOSYS;
  return false;
}

bool PinnedProcess::wait_end(std::chrono::milliseconds /*bound*/) const { return false; }

std::optional<std::string> process_executable(Pid /*pid*/) { return std::nullopt; }

}  // namespace looplock::sys
