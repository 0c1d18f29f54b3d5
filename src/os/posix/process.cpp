// process.hpp on POSIX: what /proc says (procfs.hpp).
#include "os/process.hpp"

#include <unistd.h>

#include <string_view>

#include "os/posix/procfs.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {
// In a time namespace of its own, a start time as the initial one shows it
// (procfs.hpp): what every looplock records and compares, wherever it runs.
std::optional<std::string> comparable(const std::optional<std::string>& raw) {
  if (!raw) return raw;
  const auto offsets = read_file("/proc/self/timens_offsets", 256);
  return offsets ? procfs::start_in_initial_time_ns(raw, *offsets, sysconf(_SC_CLK_TCK)) : raw;
}
}  // namespace

std::optional<std::string> process_start(Pid pid) { return comparable(procfs::pid_start(pid)); }

std::optional<std::string> own_start() {
  auto s = read_file("/proc/self/stat", 4096);
  if (!s) return std::nullopt;
  return comparable(procfs::parse_stat_start(*s));
}

bool process_alive(Pid pid) {
  if (!procfs::pid_alive(pid)) return false;
  if (!procfs::proc_is_ours()) return true;  // /proc/PID would be another process
  return !procfs::ended(pid);
}

std::vector<Pid> descendants(Pid self) { return procfs::descendants(self); }

bool process_ending(Pid pid, Pid group) {
  const auto st = procfs::proc_stat(pid);
  return !st || st->exiting() || (group != 0 && st->pgrp == group);
}

std::optional<std::string> process_name(Pid pid) { return procfs::comm(pid); }

std::optional<long long> process_age_ms(Pid pid) { return procfs::age_ms(pid); }

std::optional<std::vector<std::string>> process_args(Pid pid) { return procfs::cmdline(pid); }

std::optional<std::string> process_env(Pid pid, std::string_view name) { return procfs::environ_get(pid, name); }

std::optional<Uid> process_uid(Pid pid) { return procfs::real_uid(pid); }

std::optional<std::vector<Gid>> process_groups(Pid pid) { return procfs::group_ids(pid); }

bool is_self_or_ancestor(Pid pid, Pid self) { return procfs::is_self_or_ancestor(pid, self); }

bool pids_comparable() { return procfs::proc_is_ours(); }

bool in_child_pid_namespace() {
  const std::string ns = pid_namespace();    // empty when it cannot be told: assume the usual
  return !ns.empty() && ns != "4026531836";  // PROC_PID_INIT_INO
}

std::vector<Pid> namespace_pids(Pid pid) { return procfs::ns_pids(pid); }

std::string boot_id() {
  auto s = read_file("/proc/sys/kernel/random/boot_id", 128);
  if (!s) return {};
  while (!s->empty() && (s->back() == '\n' || s->back() == ' ')) s->pop_back();
  return *s;
}

std::string pid_namespace() {
  char buf[64];
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  if (n <= 0) return {};
  // "pid:[4026531836]": its inode.
  const std::string_view link(buf, static_cast<size_t>(n));
  const size_t open = link.find('[');
  const size_t close = link.rfind(']');
  if (open == std::string_view::npos || close == std::string_view::npos || close <= open + 1) return {};
  return std::string(link.substr(open + 1, close - open - 1));
}

bool proven_dead(const std::string& boot, const std::string& pid_ns, long long pid, const std::string& start) {
  if (boot.empty() || pid_ns.empty() || start.empty() || pid <= 0 || pid > 0x7fffffff) return false;
  if (boot != boot_id() || pid_ns != pid_namespace() || !procfs::proc_is_ours()) return false;
  if (!process_alive(static_cast<Pid>(pid))) return true;
  const auto now = process_start(static_cast<Pid>(pid));
  return now && *now != start;
}

}  // namespace looplock::sys
