#include "sys.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "unique_fd.hpp"

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

std::optional<std::string> pread_all(int fd, size_t limit) {
  std::string out;
  char buf[8192];
  off_t offset = 0;
  while (out.size() < limit) {
    size_t want = std::min(sizeof buf, limit - out.size());
    ssize_t n = retry_eintr([&] { return ::pread(fd, buf, want, offset); });
    if (n < 0) {
      return std::nullopt;
    }
    if (n == 0) {
      break;
    }
    out.append(buf, static_cast<size_t>(n));
    offset += n;
  }
  return out;
}

std::optional<std::string> read_file(const std::string& path, size_t limit) {
  UniqueFd fd(retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY); }));
  if (!fd) {
    return std::nullopt;
  }
  // /proc files report size 0 and must be read sequentially, not with pread.
  std::string out;
  char buf[8192];
  while (out.size() < limit) {
    ssize_t n = retry_eintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) {
      return std::nullopt;
    }
    if (n == 0) {
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
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

std::string utc_now_iso8601() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                ts.tv_nsec / 1000000L);
  return buf;
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace looplock::sys
