#include "os/sys.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "os/unique_fd.hpp"

namespace looplock::sys {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = retry_eintr([&] { return ::write(fd, data.data(), data.size()); });
    if (n < 0) {
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool pwrite_all(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        retry_eintr([&] { return ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(done)); });
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

namespace {
// Reads go straight into the result, in chunks of this size (no buffer on
// the stack: a fresh stack page costs a run a page fault).
constexpr size_t kChunk = 4096;

// Up to `limit` bytes from read_at(into, count, offset) (a read(2) or
// pread(2)), until it returns 0, or fewer bytes than asked where
// `short_is_end`. nullopt on error.
template <typename ReadAt>
std::optional<std::string> read_chunks(size_t limit, bool short_is_end, ReadAt read_at) {
  std::string out;
  while (out.size() < limit) {
    const size_t have = out.size();
    const size_t want = std::min(kChunk, limit - have);
    out.resize(have + want);
    const ssize_t n = retry_eintr([&] { return read_at(out.data() + have, want, static_cast<off_t>(have)); });
    if (n < 0) return std::nullopt;
    out.resize(have + static_cast<size_t>(n));
    if (n == 0 || (short_is_end && static_cast<size_t>(n) < want)) break;
  }
  return out;
}
}  // namespace

std::optional<std::string> pread_all(int fd, size_t limit) {
  // A regular file's pread(2) comes back short only at its end: no second
  // call to be told so (a file that grows meanwhile is read as it was).
  return read_chunks(limit, true, [&](char* into, size_t count, off_t at) { return ::pread(fd, into, count, at); });
}

std::optional<std::string> read_file(const std::string& path, size_t limit) {
  UniqueFd fd(retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY); }));
  if (!fd) return std::nullopt;
  // /proc files report size 0 and must be read sequentially, not with pread.
  return read_chunks(limit, false, [&](char* into, size_t count, off_t) { return ::read(fd.get(), into, count); });
}

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

long long monotonic_ms() { return monotonic_ns() / 1000000LL; }

long long realtime_ms() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000LL + ts.tv_nsec / 1000000LL;
}

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

void sleep_until_ns(long long until_ns) {
  const timespec ts{static_cast<time_t>(until_ns / 1'000'000'000LL), static_cast<long>(until_ns % 1'000'000'000LL)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

std::optional<unsigned long long> random_below(unsigned long long bound) {
  // Rejection sampling: no value is likelier than another.
  const unsigned long long limit = ~0ULL - (~0ULL % bound);
  for (;;) {
    unsigned long long v = 0;
    const ssize_t n = retry_eintr([&] { return getrandom(&v, sizeof v, 0); });
    if (n != static_cast<ssize_t>(sizeof v)) {
      if (n >= 0) errno = EIO;
      return std::nullopt;
    }
    if (v < limit) return v % bound;
  }
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
  tm t{};
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = s;
  const time_t secs = timegm(&t);
  if (t.tm_mday != d || t.tm_mon != mo - 1) return std::nullopt;  // "11-31" was normalised to 12-01
  return static_cast<long long>(secs) * 1000 + ms;
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string user_name(uid_t uid) {
  const std::string id = std::to_string(uid);
  if (auto passwd = read_file("/etc/passwd", 4 << 20)) {
    std::string_view all = *passwd;
    while (!all.empty()) {
      auto nl = all.find('\n');
      std::string_view line = all.substr(0, nl);
      all = nl == std::string_view::npos ? std::string_view{} : all.substr(nl + 1);
      auto c1 = line.find(':');
      auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
      auto c3 = c2 == std::string_view::npos ? c2 : line.find(':', c2 + 1);
      if (c3 != std::string_view::npos && line.substr(c2 + 1, c3 - c2 - 1) == id && c1 > 0) {
        return std::string(line.substr(0, c1));
      }
    }
  }
  // Never getpwuid(3): in a static program glibc would dlopen the NSS
  // modules that /etc/nsswitch.conf names (systemd, sss, ldap), which crash
  // there. A user /etc/passwd does not list is named by number.
  return id;
}

}  // namespace looplock::sys
