// Signals by name and number, over the system's own table (signal_table.hpp).
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
