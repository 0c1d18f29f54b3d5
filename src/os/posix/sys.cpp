// sys.hpp on POSIX (Linux): the system calls themselves.
#include "os/sys.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <ctime>
#include <type_traits>
#include <vector>

#include "os/ids.hpp"
#include "os/posix/interrupts.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

// os/ids.hpp's types are the system's own: no conversion at any call.
static_assert(std::is_same_v<Pid, pid_t> && std::is_same_v<Uid, uid_t> && std::is_same_v<Gid, gid_t>);

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

namespace {
sigset_t ending_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
  return set;
}
}  // namespace

bool hold_ending_signals() {
  const sigset_t set = ending_set();
  return sigprocmask(SIG_BLOCK, &set, nullptr) == 0;
}

void let_ending_signals_through() {
  const sigset_t set = ending_set();
  (void)sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

const Interrupts& ending_interrupts() {
  static const Interrupts ending{ending_set()};
  return ending;
}

int pending_ending_signal() {
  sigset_t pending;
  if (sigpending(&pending) != 0) return 0;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    if (sigismember(&pending, s) == 1) return s;
  }
  return 0;
}

bool pwrite_all(int fd, std::string_view data, long long offset) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = retry_eintr(
        [&] { return ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done)); });
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool truncate_fd(int fd, long long size) {
  return retry_eintr([&] { return ftruncate(fd, static_cast<off_t>(size)); }) == 0;
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

std::optional<std::string> pread_all(int fd, size_t limit, long long offset) {
  // A regular file's pread(2) comes back short only at its end: no second
  // call to be told so (a file that grows meanwhile is read as it was).
  return read_chunks(limit, true,
                     [&](char* into, size_t count, off_t at) { return ::pread(fd, into, count, offset + at); });
}

std::optional<std::string> pread_some(int fd, size_t size, long long offset) {
  std::string out(size, '\0');
  const ssize_t n = retry_eintr([&] { return ::pread(fd, out.data(), size, static_cast<off_t>(offset)); });
  if (n < 0) return std::nullopt;
  out.resize(static_cast<size_t>(n));
  return out;
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

long long realtime_ms() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000LL + ts.tv_nsec / 1000000LL;
}

void nap_ns(long long ns) {
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000LL), static_cast<long>(ns % 1'000'000'000LL)};
  nanosleep(&ts, nullptr);
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

std::string path_in_dir(std::string_view dir, std::string_view name) {
  std::string p(dir);
  if (!p.empty() && p.back() != '/') p += '/';
  return p += name;
}

bool is_path_separator(char c) { return c == '/'; }

std::string_view program_suffix() { return {}; }

Abilities abilities() {
  return {.exec = true,
          .signals = true,
          .inherited_lock = true,
          .cluster = true,
          .advisory_locks = true,
          .permission_bits = true,
          .case_sensitive_names = true,
          .notify = true,
          .holders = true,
          .hold = true};
}

Pid own_pid() { return getpid(); }

Uid own_uid() { return getuid(); }

Uid own_euid() { return geteuid(); }

bool is_terminal(int fd) { return isatty(fd) == 1; }

std::optional<int> terminal_width(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return std::nullopt;
  return static_cast<int>(ws.ws_col);
}

bool keep_from_commands(int fd) { return fcntl(fd, F_SETFD, FD_CLOEXEC) == 0; }  // the one descriptor flag

bool in_group(Gid gid) {
  if (getegid() == gid) return true;
  Gid groups[256];
  const int n = getgroups(256, groups);
  return n > 0 && std::find(groups, groups + n, gid) != groups + n;
}

std::optional<std::string> own_executable() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof self) return std::nullopt;  // no /proc, or cut short
  return std::string(self, static_cast<size_t>(n));
}

int execute_access(const std::string& path) {
  if (access(path.c_str(), F_OK) != 0) return ENOENT;  // none this process can see
  return access(path.c_str(), X_OK) == 0 ? 0 : errno;
}

int exec_program(const std::string& path, char** argv, const std::vector<std::string>& env) {
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  execve(path.c_str(), argv, envp.data());
  return errno;
}

void close_fd(int fd) noexcept { ::close(fd); }

std::optional<std::string> path_of_fd(int fd) {
  char buf[PATH_MAX + 1];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  // The kernel's name for a removed directory ends in " (deleted)"; anything
  // not absolute is not a path.
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof buf) - 1 || buf[0] != '/') return std::nullopt;
  std::string p(buf, static_cast<size_t>(n));
  if (p.ends_with(" (deleted)")) return std::nullopt;
  return p;
}

std::optional<std::string> real_path(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> real(realpath(path.c_str(), nullptr), &std::free);
  if (!real) return std::nullopt;
  return std::string(real.get());
}

std::optional<std::string> working_dir() {
  std::unique_ptr<char, decltype(&std::free)> cwd(getcwd(nullptr, 0), &std::free);
  if (!cwd) return std::nullopt;
  return std::string(cwd.get());
}

UniqueFd open_for_reading(const std::string& path) {
  return UniqueFd(retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); }));
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string user_name(Uid uid) {
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
