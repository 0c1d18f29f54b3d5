// process.hpp on Windows: the kernel's process objects. A process's start
// is its creation time; Windows has no boot id this code can read, so
// boot_id() is empty and nothing is proven dead here. Ancestry comes from a
// Toolhelp snapshot's parent pids, checked against creation times.
#include "os/process.hpp"

// clang-format off
#include <windows.h>
#include <tlhelp32.h>
// clang-format on

#include <filesystem>
#include <map>

#include "os/windows/support.hpp"

namespace looplock::sys {

namespace {

// A FILETIME as one number: 100 ns units since 1601.
long long ticks(const FILETIME& t) {
  return static_cast<long long>((static_cast<unsigned long long>(t.dwHighDateTime) << 32) | t.dwLowDateTime);
}

// A handle to process `pid` that can query it; nullptr (GetLastError set)
// when there is none or it may not be opened.
HANDLE open_process(Pid pid, DWORD access) {
  if (pid <= 0) {
    SetLastError(ERROR_INVALID_PARAMETER);
    return nullptr;
  }
  return OpenProcess(access, FALSE, static_cast<DWORD>(pid));
}

// When a process was created and when it exited (0: it has not), in
// ticks().
struct Times {
  long long created = 0;
  long long exited = 0;
};
std::optional<Times> times_of(HANDLE h) {
  FILETIME created{}, exited{}, kernel{}, user{};
  if (!GetProcessTimes(h, &created, &exited, &kernel, &user)) return std::nullopt;
  return Times{.created = ticks(created), .exited = ticks(exited)};
}
// Process `pid`'s, opened with the right to query only (another user's
// process may refuse more).
std::optional<Times> times_of(Pid pid) {
  HANDLE h = open_process(pid, PROCESS_QUERY_LIMITED_INFORMATION);
  if (h == nullptr) return std::nullopt;
  const auto t = times_of(h);
  CloseHandle(h);
  return t;
}

}  // namespace

std::optional<std::string> process_start(Pid pid) {
  const auto t = times_of(pid);
  // An exited process whose object lives on (another handle holds it) is no
  // process any more: its exit time is set.
  if (!t || t->exited != 0) return std::nullopt;
  return std::to_string(t->created);
}

std::optional<std::string> own_start() {
  const auto t = times_of(GetCurrentProcess());
  return t ? std::optional<std::string>(std::to_string(t->created)) : std::nullopt;
}

bool process_alive(Pid pid) {
  HANDLE h = open_process(pid, SYNCHRONIZE);
  if (h == nullptr) return GetLastError() == ERROR_ACCESS_DENIED;  // it exists, but is not ours to open
  // Not the exit code: a process may exit with 259 (STILL_ACTIVE).
  const bool running = WaitForSingleObject(h, 0) == WAIT_TIMEOUT;
  CloseHandle(h);
  return running;
}

std::vector<Pid> descendants(Pid) { return {}; }

bool process_ending(Pid pid, Pid) { return !process_alive(pid); }

std::optional<std::string> process_name(Pid pid) {
  HANDLE h = open_process(pid, PROCESS_QUERY_LIMITED_INFORMATION);
  if (h == nullptr) return std::nullopt;
  std::wstring path(32768, L'\0');
  DWORD size = static_cast<DWORD>(path.size());
  const bool named = QueryFullProcessImageNameW(h, 0, path.data(), &size) != 0;
  CloseHandle(h);
  if (!named) return std::nullopt;
  path.resize(size);
  std::wstring stem = std::filesystem::path(path).stem().wstring();
  return windows::narrow(stem, CP_UTF8);
}

std::optional<long long> process_age_ms(Pid pid) {
  const auto t = times_of(pid);
  if (!t) return std::nullopt;
  FILETIME now{};
  GetSystemTimeAsFileTime(&now);
  const long long age = (ticks(now) - t->created) / 10'000;  // 100 ns units
  return age < 0 ? 0 : age;
}

std::optional<std::vector<std::string>> process_args(Pid) { return std::nullopt; }

std::optional<std::string> process_env(Pid, std::string_view) { return std::nullopt; }

std::optional<Uid> process_uid(Pid) { return std::nullopt; }

std::optional<std::vector<Gid>> process_groups(Pid) { return std::nullopt; }

bool is_self_or_ancestor(Pid pid, Pid self) {
  if (pid <= 0) return false;
  if (pid == self) return true;
  // The parent of each process, from one snapshot of them all. A parent
  // created after its child is not its parent: the parent exited and its pid
  // went to a later process, where the chain ends.
  const HANDLE snap = CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0);
  if (snap == INVALID_HANDLE_VALUE) return false;
  std::map<DWORD, DWORD> parent;
  PROCESSENTRY32W e{};
  e.dwSize = sizeof e;
  for (bool more = Process32FirstW(snap, &e); more; more = Process32NextW(snap, &e)) {
    parent[e.th32ProcessID] = e.th32ParentProcessID;
  }
  CloseHandle(snap);
  DWORD at = static_cast<DWORD>(self);
  for (int depth = 0; depth < 1024; ++depth) {
    const auto up = parent.find(at);
    if (up == parent.end() || up->second == 0 || up->second == at) return false;
    const auto child = times_of(static_cast<Pid>(at));
    const auto parent_of = times_of(static_cast<Pid>(up->second));
    if (!child || !parent_of || parent_of->created > child->created) return false;
    if (up->second == static_cast<DWORD>(pid)) return true;
    at = up->second;
  }
  return false;
}

bool pids_comparable() { return true; }

bool in_child_pid_namespace() { return false; }

std::vector<Pid> namespace_pids(Pid) { return {}; }

std::string boot_id() { return {}; }

std::string pid_namespace() { return {}; }

bool proven_dead(const std::string&, const std::string&, long long, const std::string&) { return false; }

}  // namespace looplock::sys
