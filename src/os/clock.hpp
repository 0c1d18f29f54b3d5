// Time as looplock counts it: durations, and points on the monotonic clock,
// over std::chrono, with one "none": an empty Deadline (no deadline, no
// limit). The clock is the system's monotonic one (sys::monotonic_ns():
// CLOCK_MONOTONIC on POSIX), which the wall clock's steps do not move. A
// time becomes a number only where it leaves the process (a record, a row,
// the environment) or meets code that still counts nanoseconds.
#pragma once

#include <chrono>
#include <optional>

namespace looplock {

using Duration = std::chrono::nanoseconds;

struct MonotonicClock {
  using duration = Duration;
  using rep = Duration::rep;
  using period = Duration::period;
  using time_point = std::chrono::time_point<MonotonicClock>;
  static constexpr bool is_steady = true;
  static time_point now();
};

using Instant = MonotonicClock::time_point;
// A point in time that may be none: no deadline.
using Deadline = std::optional<Instant>;

// The Instant `ns` nanoseconds on the monotonic clock (sys::monotonic_ns()'s
// numbers), and back.
constexpr Instant instant_ns(long long ns) { return Instant(Duration(ns)); }
constexpr long long ns_of(Instant t) { return t.time_since_epoch().count(); }
// Whole milliseconds of `d` (cut toward zero), as records and rows count them.
constexpr long long ms_of(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// t + d, saturating: a duration of centuries (--max-time 100000d) is a
// deadline that never comes, not an overflow.
Instant later(Instant t, Duration d);
// The earlier of two deadlines; none when neither is set.
Deadline earliest(Deadline a, Deadline b);

// Sleeps for `d`, or less when a signal arrives: a pause between tries
// (sys::nap_ns()).
void nap(Duration d);
// Sleeps until the monotonic clock reaches `t`, signals or not.
void sleep_until(Instant t);

}  // namespace looplock
