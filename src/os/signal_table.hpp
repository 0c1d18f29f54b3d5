// The system's signals, as signal_names.cpp reads them by name and number:
// each system's code gives its table (posix/: Linux's, with its real-time
// signals; windows/: the C runtime's six).
#pragma once

#include <optional>
#include <span>

namespace looplock::signal_table {

struct Named {
  const char* name;  // without "SIG"
  int sig;
};

// The signals with names.
std::span<const Named> named();
// Whether `sig` is a signal's number.
bool valid(int sig);
// RTMIN+n, when the system has it.
std::optional<int> realtime(int n);
// n of RTMIN+n for `sig`, when it is a real-time signal.
std::optional<int> realtime_index(int sig);

}  // namespace looplock::signal_table
