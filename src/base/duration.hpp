// Durations, read and written one way: every DURATION option takes the same
// grammar, and every duration looplock prints is one number and one unit of
// that grammar ("450ms", "2.5s", "3.1m", "2.5h", "1.5d"), so that what it
// says can be typed back.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "os/clock.hpp"

namespace looplock {

// What "inf" reads as, and what anything beyond some 292 years saturates
// to: the longest Duration. An option that means "no limit" by it (and by
// 0) turns it into its one "none" with limit_of().
inline constexpr Duration kForever = Duration::max();

// A duration: a non-negative decimal number (digits with an optional
// fraction and exponent: "10", "2.5", ".5", "5.", "1e3"; "inf" or
// "infinity") with an optional unit ms, s (the default), m, h or d, as
// timeout(1) reads one plus "ms", to the nanosecond. Saturates at kForever;
// a tiny non-zero value is never rounded down to 0. nullopt, with the rule
// it broke in `why`, when it is not one.
std::optional<Duration> parse_duration(std::string_view text, std::string* why = nullptr);

// `ms` milliseconds, as records and rows hold them, saturating at kForever
// (and at -kForever): a garbled number of centuries is never an overflow.
Duration of_ms(long long ms);

// A limit as the man page's options read one (--max-time, --kill-after):
// 0 and inf mean never, as in timeout(1), which is none.
std::optional<Duration> limit_of(Duration d);

// One number and one unit, the largest unit that keeps the number at 1 or
// more: whole milliseconds below a second ("450ms"), else one decimal
// ("2.5s", "3.1m", "2.5h", "1.5d"), each rounded to the nearest printed
// digit, carrying into the next unit (999.6 ms is "1.0s", 59.96 s "1.0m");
// a duration above zero is at least "1ms" (0 would mean no limit).
// kForever is "inf"; a negative duration (a clock step backwards) is "0ms".
std::string format_duration(Duration d);

// `d` cut to what format_duration prints exactly (whole milliseconds below
// a second, tenths of the unit above): never more than `d`, so a bound
// shown as format_duration(printed_floor(bound)) is itself accepted.
Duration printed_floor(Duration d);

}  // namespace looplock
