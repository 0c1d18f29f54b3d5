// Durations, read and written one way: every DURATION option takes the same
// grammar, and every duration looplock prints is one number and one unit of
// that grammar ("450ms", "2.5s", "3.1m", "2.5h", "1.5d"), so that what it
// says can be typed back.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace looplock {

// Durations are nanoseconds (long long) throughout; these are the units,
// stated once.
inline constexpr long long kMs = 1'000'000LL;       // a millisecond
inline constexpr long long kSec = 1'000'000'000LL;  // a second

// "No limit": anything beyond some 292 years.
inline constexpr long long kForever = std::numeric_limits<long long>::max();

// A duration in nanoseconds: a non-negative decimal number (digits with an
// optional fraction and exponent: "10", "2.5", ".5", "5.", "1e3"; "inf" or
// "infinity") with an optional unit ms, s (the default), m, h or d, as
// timeout(1) reads one plus "ms". Saturates at kForever; a tiny non-zero
// value is never rounded down to 0. nullopt, with the rule it broke in `why`,
// when it is not one.
std::optional<long long> parse_duration(std::string_view text, std::string* why = nullptr);

// One number and one unit, the largest unit that keeps the number at 1 or
// more: whole milliseconds below a second ("450ms"), else one decimal
// ("2.5s", "3.1m", "2.5h", "1.5d"), each rounded to the nearest printed
// digit, carrying into the next unit (999.6 ms is "1.0s", 59.96 s "1.0m");
// a duration above zero is at least "1ms" (0 would mean no limit).
// kForever is "inf"; a negative duration (a clock step backwards) is "0ms".
std::string format_duration(long long ns);

// `ns` cut to what format_duration prints exactly (whole milliseconds below
// a second, tenths of the unit above): never more than `ns`, so a bound
// shown as format_duration(printed_floor(bound)) is itself accepted.
long long printed_floor(long long ns);

}  // namespace looplock
