// The status line of a wait for the lock, redrawn in place on a terminal
// once the wait has lasted a second (local_lock.cpp's WaitReporter).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "os/clock.hpp"

namespace looplock {

// The status line of a wait on a terminal, at most `width` bytes: the times
// first, then whom it waits for, then the lock: "looplock: waiting 1.0s (no
// deadline) for pid 123 (flock): no looplock record on DIR/.state.lock".
// When it is too wide, the path is cut (from the left, keeping its end) or
// left out, never the holder; only a holder wider than the line is cut, after
// its pid.
std::string wait_status_line(Duration waited, std::optional<Duration> left, const std::string& who,
                             const std::string& path, size_t width);

}  // namespace looplock
