#include "os/relay.hpp"

#include <cerrno>

// looplock.exe has no relay yet: --notify is refused there before a run
// (sys::abilities().notify), so none of this is reached.
namespace looplock::sys {

std::optional<Relay> start_relay(const std::function<int(int events)>& /*body*/) {
  errno = ENOSYS;
  return std::nullopt;
}

void send_event(Relay& /*relay*/, std::string /*line*/) {}

void finish_relay(Relay& relay) { relay.events.reset(); }

bool wait_readable(int /*fd*/, Deadline /*until*/) { return true; }

std::optional<std::string> read_some(int /*fd*/, size_t /*limit*/) { return std::string(); }

NotifierEnd run_notifier(const std::string& /*command*/, const std::vector<std::string>& /*env*/,
                         const std::string& /*input*/, Duration /*timeout*/) {
  return {.started = false, .err = ENOSYS};
}

}  // namespace looplock::sys
