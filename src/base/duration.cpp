#include "base/duration.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <utility>

namespace looplock {

namespace {

// The units, in nanoseconds: the grammar's arithmetic is on integers.
constexpr long long kMs = std::chrono::nanoseconds(std::chrono::milliseconds(1)).count();
constexpr long long kSec = std::chrono::nanoseconds(std::chrono::seconds(1)).count();
constexpr long long kMaxNs = kForever.count();

constexpr const char* kRule =
    "expected a non-negative number such as 10, 2.5, .5 or 1e3 (or inf), with an optional unit ms, s (the "
    "default), m, h or d, as in timeout(1)";

// The unit at the end of `text`, in nanoseconds, and the text without it.
long long take_unit(std::string_view& text) {
  if (text.ends_with("ms")) {
    text.remove_suffix(2);
    return kMs;
  }
  if (text.empty()) return kSec;
  long long unit = 0;
  switch (text.back()) {
    case 's': unit = kSec; break;
    case 'm': unit = 60 * kSec; break;
    case 'h': unit = 3600 * kSec; break;
    case 'd': unit = 86400 * kSec; break;
    default: return kSec;
  }
  text.remove_suffix(1);
  return unit;
}

bool is_infinity(std::string_view t) {
  std::string l(t);
  for (char& c : l) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return l == "inf" || l == "infinity";
}

// parse_duration's value in nanoseconds.
std::optional<long long> parse_ns(std::string_view text, std::string* why) {
  auto fail = [&](const char* rule) -> std::optional<long long> {
    if (why) *why = rule;
    return std::nullopt;
  };
  if (text.empty()) return fail(kRule);
  const long long unit = take_unit(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.starts_with('-')) return fail("a duration cannot be negative");
  if (is_infinity(text)) return kMaxNs;
  if (text.size() > 1 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    return fail("hexadecimal numbers are not accepted");
  }
  // Mantissa digits (without leading zeros) and the power of ten they are
  // scaled by: value = digits * 10^exp10 units.
  std::string digits;
  long long exp10 = 0;
  size_t i = 0;
  bool any = false, dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.' && !dot) {
      dot = true;
    } else if (c >= '0' && c <= '9') {
      any = true;
      if (!(digits.empty() && c == '0')) digits += c;
      if (dot) --exp10;
    } else {
      break;
    }
  }
  if (!any) return fail(kRule);
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
    long long e = 0;
    bool edigits = false;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      edigits = true;
      if (e < 100000) e = e * 10 + (text[i] - '0');
    }
    if (!edigits) return fail(kRule);
    exp10 += negative ? -e : e;
  }
  if (i != text.size()) return fail(kRule);
  if (digits.empty()) return 0;
  // digits * 10^exp10 * unit, in integers: the unit's own factors of ten
  // first (a nanosecond unit is 10^6 for ms, 10^9 for s; m, h and d keep a
  // remaining factor), saturating at kForever and never rounded down to 0.
  long long factor = unit;
  long long shift = exp10;
  while (factor % 10 == 0) {
    factor /= 10;
    ++shift;
  }
  if (static_cast<long long>(digits.size()) + shift > 19) return kMaxNs;
  long long value = 0;
  bool remainder = false;
  const long long keep = static_cast<long long>(digits.size()) + std::min(shift, 0LL);
  auto scale = [&](long long by, long long add) {  // value = value * by + add, false on overflow
    return !__builtin_mul_overflow(value, by, &value) && !__builtin_add_overflow(value, add, &value);
  };
  for (long long k = 0; k < static_cast<long long>(digits.size()); ++k) {
    const int d = digits[static_cast<size_t>(k)] - '0';
    if (k >= keep) {
      remainder = remainder || d != 0;
    } else if (!scale(10, d)) {
      return kMaxNs;
    }
  }
  for (long long k = 0; k < shift; ++k) {
    if (!scale(10, 0)) return kMaxNs;
  }
  if (!scale(factor, 0)) return kMaxNs;
  if (remainder && !scale(1, 1)) return kMaxNs;  // 1e-10 s is not 0 ("never")
  return value;
}

struct Unit {
  long long ns;
  char name;
};
constexpr Unit kUnits[] = {{kSec, 's'}, {60 * kSec, 'm'}, {3600 * kSec, 'h'}, {86400 * kSec, 'd'}};

// n / d rounded to the nearest (halves up), without overflow.
long long div_round(long long n, long long d) { return n / d + (n % d >= d - n % d ? 1 : 0); }

// The unit format_duration prints `ns` (at least 1 s after rounding) in,
// and its value in tenths of it.
std::pair<const Unit*, long long> printed_tenths(long long ns) {
  for (const Unit& u : kUnits) {
    const long long tenths = div_round(ns, u.ns / 10);
    const bool last = &u == &kUnits[std::size(kUnits) - 1];
    if (last || tenths < 10 * ((&u + 1)->ns / u.ns)) return {&u, tenths};  // else it carries: 60.0s is 1.0m
  }
  return {nullptr, 0};
}

}  // namespace

std::optional<Duration> parse_duration(std::string_view text, std::string* why) {
  const auto ns = parse_ns(text, why);
  if (!ns) return std::nullopt;
  return Duration(*ns);
}

Duration of_ms(long long ms) {
  constexpr long long most = kMaxNs / kMs;
  if (ms > most) return kForever;
  if (ms < -most) return -kForever;
  return std::chrono::milliseconds(ms);
}

std::optional<Duration> limit_of(Duration d) {
  if (d == Duration::zero() || d == kForever) return std::nullopt;
  return d;
}

std::string format_duration(Duration d) {
  if (d == kForever) return "inf";
  long long ns = d.count();
  if (ns < 0) ns = 0;
  char buf[64];
  if (const long long ms = div_round(ns, kMs); ms < 1000) {
    // Never 0ms for a duration above zero: typed back, 0 means no limit.
    std::snprintf(buf, sizeof buf, "%lldms", ms == 0 && ns > 0 ? 1 : ms);
    return buf;
  }
  const auto [u, tenths] = printed_tenths(ns);
  std::snprintf(buf, sizeof buf, "%lld.%lld%c", tenths / 10, tenths % 10, u->name);
  return buf;
}

Duration printed_floor(Duration d) {
  const long long ns = d.count();
  if (d == kForever || ns <= 0) return ns < 0 ? Duration::zero() : d;
  if (ns < kSec) return Duration(ns / kMs * kMs);
  // The unit format_duration prints it in; cut to tenths of that unit.
  const Unit* u = printed_tenths(ns).first;
  long long step = u->ns / 10;
  if (ns / step * step < u->ns && u != kUnits) step = (u - 1)->ns / 10;  // cut below the unit: the smaller one's
  return Duration(ns / step * step);
}

}  // namespace looplock
