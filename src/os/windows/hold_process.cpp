// Windows has no hold across steps yet (abilities().hold is false): no
// detached holder, no sentinel, no pinned process.
#include <cerrno>

#include "os/hold_process.hpp"

namespace looplock::sys {

std::optional<Detached> detach_holder() {
  errno = ENOSYS;
  return std::nullopt;
}

bool quiet_stderr() { return false; }

HolderReport await_holder(Pid /*child*/, int /*report_fd*/, int /*tie*/,
                          const std::function<int(const std::string&)>& /*deliver*/) {
  return {};
}

std::string hold_socket_key(std::string_view /*secret*/) { return {}; }

bool pidfds_available() { return false; }

void stop_holder(Pid /*child*/) {}

int hold_sentinel(const SentinelSpec& /*spec*/) { return 71; }

bool hold_tie_ended(int /*conn*/) { return false; }

HoldShare fetch_hold_fd(Pid /*holder*/, const std::string& /*holder_start*/, std::string_view /*secret*/) {
  errno = ENOSYS;
  return {};
}

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
