// Signals by name and number, from the system's own table (posix/: every
// signal of Linux, and RTMIN+N; windows/: the C runtime's six).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace looplock {

// A signal by name ("USR1", "SIGUSR1", "usr1"), "RTMIN+N", or number; nullopt
// when it is none.
std::optional<int> parse_signal(std::string_view text);
// "USR1", "RTMIN+2", or the number.
std::string signal_name(int sig);

}  // namespace looplock
