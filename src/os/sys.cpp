// sys.hpp's part that is the same on every system: time as text.
#include "os/sys.hpp"

#include <chrono>
#include <cstdio>

namespace looplock::sys {

long long monotonic_ms() { return monotonic_ns() / 1000000LL; }

std::string utc_iso8601(long long ms) {
  // The civil date of a day count (Howard Hinnant's days_from_civil
  // inverse): UTC needs no time zone, so gmtime(3)'s reading of
  // /etc/localtime is avoided on every run.
  long long secs = ms >= 0 ? ms / 1000 : (ms - 999) / 1000;
  long long millis = ms - secs * 1000;
  long long days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400;
  long long rem = secs - days * 86400;
  days += 719468;
  long long era = (days >= 0 ? days : days - 146096) / 146097;
  long long doe = days - era * 146097;
  long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  long long mp = (5 * doy + 2) / 153;
  long long day = doy - (153 * mp + 2) / 5 + 1;
  long long month = mp < 10 ? mp + 3 : mp - 9;
  long long year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%03lldZ", year, month, day, rem / 3600,
                (rem / 60) % 60, rem % 60, millis);
  return buf;
}

std::string utc_now_iso8601() { return utc_iso8601(realtime_ms()); }

std::optional<long long> parse_utc_ms(const std::string& iso) {
  // Exactly "YYYY-MM-DDTHH:MM:SS.mmmZ": fixed digits, no signs or spaces.
  static constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (iso.size() != kShape.size()) return std::nullopt;
  for (size_t i = 0; i < kShape.size(); ++i) {
    bool ok = kShape[i] == 'd' ? (iso[i] >= '0' && iso[i] <= '9') : iso[i] == kShape[i];
    if (!ok) return std::nullopt;
  }
  auto num = [&](size_t pos, size_t len) {
    int v = 0;
    for (size_t i = pos; i < pos + len; ++i) v = v * 10 + (iso[i] - '0');
    return v;
  };
  const int y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), s = num(17, 2),
            ms = num(20, 3);
  if (mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || s > 59) return std::nullopt;
  namespace chr = std::chrono;
  const chr::year_month_day date{chr::year{y}, chr::month{static_cast<unsigned>(mo)},
                                 chr::day{static_cast<unsigned>(d)}};
  if (!date.ok()) return std::nullopt;  // "11-31", "02-29" of a common year
  const long long days = chr::sys_days{date}.time_since_epoch().count();
  return ((days * 24 + h) * 60 + mi) * 60000LL + s * 1000LL + ms;
}

}  // namespace looplock::sys
