#include "os/posix/procfs.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"

namespace looplock::procfs {

namespace {

// Fields after the command name, which is in parentheses and may itself hold
// spaces and parentheses: everything after the last ')'.
std::vector<std::string_view> stat_fields_after_comm(std::string_view stat) {
  std::vector<std::string_view> fields;
  auto close = stat.rfind(')');
  if (close == std::string_view::npos) return fields;
  std::string_view rest = stat.substr(close + 1);
  size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && (rest[i] == ' ' || rest[i] == '\n')) ++i;
    size_t j = i;
    while (j < rest.size() && rest[j] != ' ' && rest[j] != '\n') ++j;
    if (j > i) fields.push_back(rest.substr(i, j - i));
    i = j;
  }
  return fields;
}

std::string proc_path(Pid pid, const char* leaf) { return "/proc/" + std::to_string(pid) + "/" + leaf; }

template <typename T>
std::optional<T> to_number(std::string_view s, int base = 10) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// "fe:00:10952825" -> matches st_dev/st_ino of `file`.
bool device_inode_matches(std::string_view field, const sys::FileStatus& file) {
  auto c1 = field.find(':');
  auto c2 = field.find(':', c1 == std::string_view::npos ? c1 : c1 + 1);
  if (c1 == std::string_view::npos || c2 == std::string_view::npos) return false;
  auto maj = to_number<unsigned>(field.substr(0, c1), 16);
  auto min = to_number<unsigned>(field.substr(c1 + 1, c2 - c1 - 1), 16);
  auto ino = to_number<unsigned long long>(field.substr(c2 + 1));
  return maj && min && ino && *maj == major(file.device) && *min == minor(file.device) &&
         *ino == static_cast<unsigned long long>(file.inode);
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\n') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// Parses one lock line ("1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF"),
// skipping blocked waiters ("1: -> FLOCK ...") unless `waiter`, which reads
// only those.
std::optional<sys::KernelLock> parse_lock_line(std::string_view line, const sys::FileStatus& file, bool waiter = false) {
  auto w = words(line);
  if (waiter) {
    if (w.size() < 7 || w[1] != "->") return std::nullopt;
    w.erase(w.begin() + 1);
  }
  if (w.size() < 6 || w[1] == "->" || w[1] != "FLOCK") return std::nullopt;
  if (!device_inode_matches(w[5], file)) return std::nullopt;
  auto pid = to_number<long>(w[4]);
  sys::KernelLock k;
  k.pid = pid ? static_cast<Pid>(*pid) : -1;
  k.exclusive = w[3] == "WRITE";
  return k;
}

}  // namespace

std::optional<std::string> parse_stat_start(std::string_view stat) {
  auto f = stat_fields_after_comm(stat);
  // After comm: field 3 (state) is index 0, so field 22 (starttime) is index 19.
  if (f.size() < 20 || !to_number<unsigned long long>(f[19])) return std::nullopt;
  return std::string(f[19]);
}

std::optional<std::string> start_in_initial_time_ns(const std::optional<std::string>& raw, std::string_view offsets,
                                                    long hz) {
  if (!raw) return raw;
  // Lines "<clock> <seconds> <nanoseconds>"; the boottime one counts.
  for (size_t at = 0; at < offsets.size();) {
    size_t nl = offsets.find('\n', at);
    if (nl == std::string_view::npos) nl = offsets.size();
    std::string_view line = offsets.substr(at, nl - at);
    at = nl + 1;
    if (!line.starts_with("boottime ")) continue;
    long long secs = 0;
    long long nsecs = 0;
    if (std::sscanf(std::string(line).c_str(), "boottime %lld %lld", &secs, &nsecs) != 2 || hz <= 0) return raw;
    const auto start = to_number<long long>(*raw);
    if (!start) return raw;
    // The kernel adds the offset in nanoseconds, then counts ticks: the
    // same, to the tick, for offsets of whole ticks (unshare's: seconds);
    // another offset is left as read (a start time that may be a tick off
    // must not prove a live process dead).
    const long long ns_per_tick = 1'000'000'000LL / hz;
    if (ns_per_tick == 0 || nsecs % ns_per_tick != 0) return raw;
    const long long shift = secs * hz + nsecs / ns_per_tick;
    if (shift == 0 || *start < shift) return raw;
    return std::to_string(*start - shift);
  }
  return raw;
}

std::optional<Pid> parse_stat_ppid(std::string_view stat) {
  auto f = stat_fields_after_comm(stat);
  if (f.size() < 2) return std::nullopt;
  auto v = to_number<long>(f[1]);
  if (!v) return std::nullopt;
  return static_cast<Pid>(*v);
}

std::optional<ProcStat> parse_proc_stat(std::string_view stat) {
  auto f = stat_fields_after_comm(stat);
  // After comm: state is index 0, pgrp index 2, flags (field 9) index 6.
  if (f.size() < 7 || f[0].size() != 1) return std::nullopt;
  auto pgrp = to_number<long>(f[2]);
  auto flags = to_number<unsigned long>(f[6]);
  if (!pgrp || !flags) return std::nullopt;
  return ProcStat{f[0][0], static_cast<Pid>(*pgrp), *flags};
}

std::optional<ProcStat> proc_stat(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "stat"), 4096);
  if (!s) return std::nullopt;
  return parse_proc_stat(*s);
}

std::optional<std::string> pid_start(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "stat"), 4096);
  if (!s) return std::nullopt;
  return parse_stat_start(*s);
}


bool proc_is_ours() {
  char buf[32];
  const ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
  if (n <= 0) return false;
  return std::string_view(buf, static_cast<size_t>(n)) == std::to_string(getpid());
}

std::vector<Pid> parse_ns_pids(std::string_view status) {
  std::vector<Pid> out;
  bool bad = false;
  sys::for_each_line(status, [&](std::string_view line) {
    if (!line.starts_with("NSpid:") || !out.empty()) return;
    for (auto w : words(line.substr(6))) {
      auto v = to_number<long>(w);
      bad = bad || !v;
      if (v) out.push_back(static_cast<Pid>(*v));
    }
  });
  return bad ? std::vector<Pid>{} : out;
}

std::vector<Pid> ns_pids(Pid pid) {
  auto s = sys::read_file(pid == 0 ? std::string("/proc/self/status") : proc_path(pid, "status"), 1 << 16);
  return s ? parse_ns_pids(*s) : std::vector<Pid>{};
}

std::optional<std::string> comm(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "comm"), 256);
  if (!s) return std::nullopt;
  while (!s->empty() && s->back() == '\n') s->pop_back();
  return s;
}

std::optional<Pid> parent_pid(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "stat"), 4096);
  if (!s) return std::nullopt;
  return parse_stat_ppid(*s);
}

std::optional<SignalMasks> parse_signal_masks(std::string_view status) {
  SignalMasks m;
  int found = 0;
  sys::for_each_line(status, [&](std::string_view line) {
    struct Field {
      std::string_view name;
      unsigned long long SignalMasks::*mask;
    };
    for (const Field f : {Field{"SigBlk:", &SignalMasks::blocked}, Field{"SigIgn:", &SignalMasks::ignored},
                          Field{"SigCgt:", &SignalMasks::caught}}) {
      if (!line.starts_with(f.name)) continue;
      std::string_view hex = line.substr(f.name.size());
      while (!hex.empty() && (hex.front() == ' ' || hex.front() == '\t')) hex.remove_prefix(1);
      unsigned long long v = 0;
      const auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
      if (ec == std::errc() && p != hex.data()) {
        m.*f.mask = v;
        ++found;
      }
    }
  });
  if (found != 3) return std::nullopt;
  return m;
}

std::optional<SignalMasks> signal_masks(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "status"), 1 << 16);
  if (!s) return std::nullopt;
  return parse_signal_masks(*s);
}

bool is_self_or_ancestor(Pid pid, Pid self) {
  if (pid <= 0) return false;
  Pid cur = self;
  for (int depth = 0; depth < 4096 && cur > 0; ++depth) {
    if (cur == pid) return true;
    auto pp = parent_pid(cur);
    if (!pp || *pp == cur) return false;
    cur = *pp;
  }
  return false;
}

bool pid_alive(Pid pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) == 0 || errno == EPERM;
}

std::vector<sys::KernelLock> parse_proc_locks(std::string_view content, const sys::FileStatus& file) {
  return parse_lock_table(content, file).holders;
}

LockTable parse_lock_table(std::string_view content, const sys::FileStatus& file) {
  LockTable t;
  sys::for_each_line(content, [&](std::string_view line) {
    if (auto k = parse_lock_line(line, file)) t.holders.push_back(*k);
    if (auto k = parse_lock_line(line, file, /*waiter=*/true)) t.waiters.push_back(*k);
  });
  return t;
}

std::optional<LockTable> lock_table(const sys::FileStatus& file) {
  auto content = sys::read_file("/proc/locks", 64 << 20);
  if (!content) return std::nullopt;
  return parse_lock_table(*content, file);
}

std::optional<long long> age_ms(Pid pid) {
  auto start = pid_start(pid);
  auto uptime = sys::read_file("/proc/uptime", 256);
  const long hz = sysconf(_SC_CLK_TCK);
  if (!start || !uptime || hz <= 0) return std::nullopt;
  const double up_s = std::strtod(uptime->c_str(), nullptr);
  const double started_s = std::strtod(start->c_str(), nullptr) / static_cast<double>(hz);
  if (up_s <= 0 || started_s > up_s + 1) return std::nullopt;
  return static_cast<long long>((up_s - started_s) * 1000);
}

std::optional<std::vector<std::string>> cmdline(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "cmdline"), 1 << 20);
  if (!s || s->empty()) return std::nullopt;
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s->size()) {
    size_t end = s->find('\0', at);
    if (end == std::string::npos) end = s->size();
    out.push_back(s->substr(at, end - at));
    at = end + 1;
  }
  return out;
}

std::optional<std::string> environ_get(Pid pid, std::string_view name) {
  auto s = sys::read_file(proc_path(pid, "environ"), 1 << 20);
  if (!s) return std::nullopt;
  std::string_view all = *s;
  while (!all.empty()) {
    size_t end = all.find('\0');
    std::string_view entry = all.substr(0, end);
    if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
      return std::string(entry.substr(name.size() + 1));
    }
    if (end == std::string_view::npos) break;
    all.remove_prefix(end + 1);
  }
  return std::nullopt;
}

std::optional<Uid> real_uid(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "status"), 1 << 16);
  if (!s) return std::nullopt;
  auto at = s->find("\nUid:");
  if (at == std::string::npos) return std::nullopt;
  auto w = words(std::string_view(*s).substr(at + 5, 64));
  if (w.empty()) return std::nullopt;
  auto v = to_number<unsigned long>(w[0]);
  if (!v) return std::nullopt;
  return static_cast<Uid>(*v);
}

std::vector<Gid> parse_group_ids(std::string_view status) {
  std::vector<Gid> out;
  auto add = [&](std::string_view field, size_t most) {
    const size_t at = status.find(field);
    if (at == std::string_view::npos || (at != 0 && status[at - 1] != '\n')) return;
    std::string_view rest = status.substr(at + field.size());
    rest = rest.substr(0, rest.find('\n'));
    size_t taken = 0;
    for (auto w : words(rest)) {
      if (taken++ == most) break;
      if (auto v = to_number<unsigned long>(w)) out.push_back(static_cast<Gid>(*v));
    }
  };
  add("Gid:", 2);  // real and effective
  add("Groups:", SIZE_MAX);
  return out;
}

std::optional<std::vector<Gid>> group_ids(Pid pid) {
  auto s = sys::read_file(proc_path(pid, "status"), 1 << 16);
  if (!s) return std::nullopt;
  return parse_group_ids(*s);
}

std::optional<std::vector<sys::KernelLock>> flock_holders(const sys::FileStatus& file) {
  auto table = procfs::lock_table(file);
  if (!table) return std::nullopt;
  return table->holders;
}

bool parse_fdinfo_holds(std::string_view fdinfo, const sys::FileStatus& file, bool exclusive) {
  bool holds = false;
  sys::for_each_line(fdinfo, [&](std::string_view line) {
    if (!line.starts_with("lock:")) return;
    auto k = parse_lock_line(line.substr(5), file);
    holds = holds || (k && (!exclusive || k->exclusive));
  });
  return holds;
}

namespace {

// The lock held through /proc/PID/fd/FD on `file`, if any.
std::optional<sys::KernelLock> fd_lock(Pid pid, int fd, const sys::FileStatus& file) {
  if (pid <= 0 || fd < 0) return std::nullopt;
  std::string base = "/proc/" + std::to_string(pid);
  sys::FileStatus target;
  if (!sys::status_of_path((base + "/fd/" + std::to_string(fd)), target)) return std::nullopt;
  if (!sys::same_file(target, file)) return std::nullopt;
  auto info = sys::read_file(base + "/fdinfo/" + std::to_string(fd), 1 << 20);
  if (!info) return std::nullopt;
  for (const auto exclusive : {true, false}) {
    if (parse_fdinfo_holds(*info, file, exclusive)) return sys::KernelLock{pid, exclusive};
  }
  return std::nullopt;
}

}  // namespace

bool fd_holds_flock(Pid pid, int fd, const sys::FileStatus& file, bool exclusive) {
  auto k = fd_lock(pid, fd, file);
  return k && (!exclusive || k->exclusive);
}

namespace {

std::vector<std::string> dir_entries(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  closedir(d);
  return out;
}

}  // namespace

std::vector<Pid> descendants(Pid pid) {
  std::vector<Pid> out;
  std::vector<Pid> todo{pid};
  while (!todo.empty() && out.size() < 100000) {
    Pid p = todo.back();
    todo.pop_back();
    std::string base = "/proc/" + std::to_string(p) + "/task";
    // Children are listed per thread; a single-threaded process has one,
    // whose tid is its pid (no directory listing needed).
    std::vector<std::string> tids{std::to_string(p)};
    if (p != pid) tids = dir_entries(base);  // the root: looplock itself, one thread
    for (const auto& tid : tids) {
      auto kids = sys::read_file(base + "/" + tid + "/children", 1 << 20);
      if (!kids) continue;
      for (auto w : words(*kids)) {
        if (auto k = to_number<long>(w)) {
          out.push_back(static_cast<Pid>(*k));
          todo.push_back(static_cast<Pid>(*k));
        }
      }
    }
  }
  return out;
}

bool ended(Pid pid) {
  const auto st = proc_stat(pid);
  if (!st || (st->state != 'Z' && st->state != 'X')) return false;
  // A main thread that ended while other threads run on is a zombie too:
  // the process lives (and keeps its descriptors) until its last thread ends.
  for (const auto& tid : dir_entries("/proc/" + std::to_string(pid) + "/task")) {
    if (tid != std::to_string(pid)) return false;
  }
  return true;
}

std::vector<Pid> all_pids() {
  std::vector<Pid> out;
  for (const auto& e : dir_entries("/proc")) {
    if (auto n = to_number<long>(e)) out.push_back(static_cast<Pid>(*n));
  }
  return out;
}

std::vector<sys::KernelLock> fd_holders(const std::vector<Pid>& pids, const sys::FileStatus& file) {
  std::vector<sys::KernelLock> out;
  for (Pid p : pids) {
    for (const auto& fd : dir_entries("/proc/" + std::to_string(p) + "/fd")) {
      auto n = to_number<int>(fd);
      if (!n) continue;
      if (auto k = fd_lock(p, *n, file)) {
        out.push_back(*k);
        break;
      }
    }
  }
  return out;
}

std::vector<Pid> pids_holding_flock(const std::vector<Pid>& pids, const sys::FileStatus& file) {
  std::vector<Pid> out;
  for (const auto& k : fd_holders(pids, file)) out.push_back(k.pid);
  return out;
}

}  // namespace looplock::procfs
