#include "base/duration.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace {
// The tests read rows of nanoseconds; these wrap the Duration interface.
constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1'000'000'000LL;
constexpr long long kForever = looplock::kForever.count();
std::optional<long long> parse_duration(std::string_view text, std::string* why = nullptr) {
  const auto d = looplock::parse_duration(text, why);
  return d ? std::optional<long long>(d->count()) : std::nullopt;
}
std::string format_duration(long long ns) { return looplock::format_duration(looplock::Duration(ns)); }
long long printed_floor(long long ns) { return looplock::printed_floor(looplock::Duration(ns)).count(); }
constexpr long long kMin = 60 * kSec;
constexpr long long kHour = 60 * kMin;
constexpr long long kDay = 24 * kHour;
}  // namespace

TEST_CASE("parse_duration reads what timeout(1) reads, and ms") {
  CHECK(parse_duration("0") == 0);
  CHECK(parse_duration("5") == 5 * kSec);
  CHECK(parse_duration("0.25") == kSec / 4);
  CHECK(parse_duration("1.000000001") == kSec + 1);
  CHECK(parse_duration("007") == 7 * kSec);
  CHECK(parse_duration("000000000001") == kSec);  // leading zeros are not magnitude
  CHECK(parse_duration(".5") == kSec / 2);
  CHECK(parse_duration("5.") == 5 * kSec);
  CHECK(parse_duration("+5") == 5 * kSec);
  CHECK(parse_duration("1e3") == 1000 * kSec);
  CHECK(parse_duration("2.5E-1") == kSec / 4);
  CHECK(parse_duration("1e-9") == 1);
  CHECK(parse_duration("1e-10") == 1);  // a tiny duration is not 0 ("never")
  CHECK(parse_duration("0e5") == 0);
  CHECK(parse_duration("10") == 10 * kSec);
  CHECK(parse_duration("2.5s") == 2 * kSec + kSec / 2);
  CHECK(parse_duration("1m") == 60 * kSec);
  CHECK(parse_duration("0.5m") == 30 * kSec);
  CHECK(parse_duration("2h") == 7200 * kSec);
  CHECK(parse_duration("1d") == 86400 * kSec);
  CHECK(parse_duration("0s") == 0);
  CHECK(parse_duration("450ms") == 450 * kMs);
  CHECK(parse_duration("0ms") == 0);
  CHECK(parse_duration("1.5ms") == 1'500'000);
  CHECK(parse_duration("1e3ms") == kSec);
  CHECK(parse_duration("1e-10m") == 6);  // 6 ns, exactly
  CHECK(parse_duration("1e3s") == 1000 * kSec);
  CHECK(parse_duration("11574d") == 11574LL * 86400 * kSec);
  CHECK(parse_duration("inf") == kForever);
  CHECK(parse_duration("Infinity") == kForever);
  CHECK(parse_duration("infd") == kForever);
  CHECK(parse_duration("1e30") == kForever);  // saturates, as timeout(1) does
  CHECK(parse_duration("99999999999999999999") == kForever);
  CHECK(parse_duration("106752d") == kForever);
  CHECK(parse_duration("9223372036.854775807") == kForever);
  CHECK(parse_duration("9223372036.854775806") == kForever - 1);

  for (const char* bad : {"",     "s", "m",  "5x", "1 m", "1M",  "m5",   "abc", "nan",  " 5",  "5 ",   "1,5",
                          "1..2", ".", "e3", "1e", "1e+", "++1", "1e3x", "ms",  "1mss", "1sm", "1 ms", "1MS"}) {
    std::string shown = bad;
    CAPTURE(shown);
    std::string why;
    CHECK_FALSE(parse_duration(bad, &why));
    CHECK(why.find("timeout(1)") != std::string::npos);
  }
  std::string why;
  CHECK_FALSE(parse_duration("-1", &why));
  CHECK(why == "a duration cannot be negative");
  CHECK_FALSE(parse_duration("-0.5m", &why));
  CHECK(why == "a duration cannot be negative");
  CHECK_FALSE(parse_duration("0x10", &why));
  CHECK(why == "hexadecimal numbers are not accepted");
}

TEST_CASE("format_duration: one number, one unit") {
  CHECK(format_duration(0) == "0ms");
  CHECK(format_duration(499'999) == "1ms");  // above zero: never 0ms, which typed back means no limit
  CHECK(format_duration(1) == "1ms");
  CHECK(format_duration(999'999) == "1ms");
  CHECK(format_duration(450 * kMs) == "450ms");
  CHECK(format_duration(999 * kMs) == "999ms");
  CHECK(format_duration(kSec) == "1.0s");
  CHECK(format_duration(12'345 * kMs) == "12.3s");
  CHECK(format_duration(59'940 * kMs) == "59.9s");
  CHECK(format_duration(59'960 * kMs) == "1.0m");  // rounded to 60.0s, carried: never "60.0s"
  CHECK(format_duration(3'960 * kMs) == "4.0s");   // the nearest printed digit, not 3.9s
  CHECK(format_duration(999'500'000) == "1.0s");   // 1000ms carries into seconds
  CHECK(format_duration(999'499'999) == "999ms");
  CHECK(format_duration(1'500'000) == "2ms");
  CHECK(format_duration(23 * kHour + 58 * kMin) == "1.0d");
  CHECK(format_duration(kMin) == "1.0m");
  CHECK(format_duration(182 * kSec) == "3.0m");
  CHECK(format_duration(183 * kSec) == "3.1m");
  CHECK(format_duration(186 * kSec) == "3.1m");
  CHECK(format_duration(kHour) == "1.0h");
  CHECK(format_duration(150 * kMin) == "2.5h");
  CHECK(format_duration(kDay) == "1.0d");
  CHECK(format_duration(36 * kHour) == "1.5d");
  CHECK(format_duration(kForever) == "inf");
  CHECK(format_duration(-5) == "0ms");  // a clock step backwards
}

TEST_CASE("what format_duration prints parses back, within half a printed digit") {
  for (long long ns : {0LL, 1LL, 5 * kMs, 450 * kMs, kSec, 2500 * kMs, 59'999 * kMs, kMin, 186 * kSec, kHour,
                       150 * kMin, kDay, 36 * kHour, 400 * kDay, kForever}) {
    CAPTURE(ns);
    const std::string shown = format_duration(ns);
    CAPTURE(shown);
    const auto back = parse_duration(shown);
    REQUIRE(back);
    if (ns != kForever) {
      const long long half = shown.ends_with("ms") ? kMs / 2 : *back / 20;  // half a digit of one decimal
      CHECK(std::llabs(*back - ns) <= (shown == "1ms" ? kMs : std::max(half, kMs / 2)));  // above zero: 1ms
    }
    CHECK(format_duration(*back) == shown);
  }
}

TEST_CASE("printed_floor: what format_duration prints exactly, never more") {
  CHECK(printed_floor(6'366'666'666) == 6'300 * kMs);  // the most --kill-after at --ttl 10: shown as 6.3s
  CHECK(printed_floor(59'960 * kMs) == 59'900 * kMs);  // not 1.0m (60 s): more than it
  CHECK(printed_floor(999'700'000) == 999 * kMs);
  CHECK(printed_floor(93 * kSec) == 90 * kSec);
  CHECK(printed_floor(0) == 0);
  for (long long ns : {1LL, 1'770'000'000LL, 6'360'000'000LL, 59'999 * kMs, 3'599 * kSec, 86'399 * kSec, 400 * kDay}) {
    CAPTURE(ns);
    const long long f = printed_floor(ns);
    CHECK(f <= ns);
    CHECK(parse_duration(format_duration(f)) == f);
  }
}

TEST_CASE("limit_of: 0 and inf are no limit, as timeout(1) reads them") {
  using looplock::Duration;
  using looplock::limit_of;
  CHECK_FALSE(limit_of(Duration::zero()));
  CHECK_FALSE(limit_of(looplock::kForever));
  CHECK(limit_of(Duration(1)) == Duration(1));
  CHECK(limit_of(looplock::kForever - Duration(1)) == looplock::kForever - Duration(1));
  CHECK_FALSE(limit_of(*looplock::parse_duration("inf")));
  CHECK_FALSE(limit_of(*looplock::parse_duration("1e30")));  // saturated: beyond some 292 years
}

TEST_CASE("of_ms: a record's milliseconds, saturating instead of overflowing") {
  using looplock::of_ms;
  CHECK(of_ms(0) == looplock::Duration::zero());
  CHECK(of_ms(1500).count() == 1'500'000'000LL);
  CHECK(of_ms(-3000).count() == -3'000'000'000LL);
  CHECK(of_ms(9'223'372'036'854LL) == std::chrono::milliseconds(9'223'372'036'854LL));  // the largest that fits
  CHECK(of_ms(9'223'372'036'855LL) == looplock::kForever);  // year 9999 written by a garbled clock
  CHECK(of_ms(std::numeric_limits<long long>::max()) == looplock::kForever);
  CHECK(of_ms(std::numeric_limits<long long>::min()) == -looplock::kForever);
  CHECK(looplock::format_duration(of_ms(std::numeric_limits<long long>::max())) == "inf");
}
