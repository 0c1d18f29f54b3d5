// sys.hpp on Windows, after Microsoft's documentation of each call (wine runs
// the unit tests, tests/unit/test_os.cpp; it does not check every rule).
// Descriptors are the C runtime's, as on POSIX; a positioned read or write
// goes to the descriptor's HANDLE with an OVERLAPPED offset, which on a
// synchronous handle moves the file pointer: it is put back, so that the
// file offset stays, as pread(2) and pwrite(2) promise.
#include "os/sys.hpp"

// windows.h first: bcrypt.h needs what it declares.
// clang-format off
#include <windows.h>
#include <winternl.h>
#include <bcrypt.h>
#include <lmcons.h>
#include <fcntl.h>
#include <io.h>
// clang-format on

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <filesystem>
#include <thread>
#include <vector>

#include "os/windows/interrupts.hpp"
#include "os/windows/support.hpp"

namespace looplock::sys {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(data.size(), INT_MAX));
    const int n = _write(fd, data.data(), chunk);
    if (n < 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool truncate_fd(int fd, long long size) { return _chsize_s(fd, size) == 0; }

namespace {
// Calls io(handle, overlapped at `offset`) and puts the descriptor's file
// pointer back afterwards. -1 (errno EBADF) when fd has no handle.
template <typename Io>
bool at_offset(int fd, Io io) {
  const HANDLE h = reinterpret_cast<HANDLE>(_get_osfhandle(fd));
  if (h == INVALID_HANDLE_VALUE) {
    errno = EBADF;
    return false;
  }
  const long long kept = _lseeki64(fd, 0, SEEK_CUR);
  const bool ok = io(h);
  if (kept >= 0) _lseeki64(fd, kept, SEEK_SET);
  return ok;
}

OVERLAPPED at(unsigned long long offset) {
  OVERLAPPED o{};
  o.Offset = static_cast<DWORD>(offset);
  o.OffsetHigh = static_cast<DWORD>(offset >> 32);
  return o;
}
}  // namespace

bool hold_ending_signals() { return true; }
void let_ending_signals_through() {}
int pending_ending_signal() { return 0; }
const Interrupts& ending_interrupts() {
  static const Interrupts none;
  return none;
}

bool pwrite_all(int fd, std::string_view data, long long offset) {
  return at_offset(fd, [&](HANDLE h) {
    size_t done = 0;
    while (done < data.size()) {
      OVERLAPPED o = at(static_cast<unsigned long long>(offset) + done);
      DWORD n = 0;
      const DWORD chunk = static_cast<DWORD>(std::min<size_t>(data.size() - done, 1u << 30));
      if (!WriteFile(h, data.data() + done, chunk, &n, &o)) {
        errno = EIO;
        return false;
      }
      done += n;
    }
    return true;
  });
}

std::optional<std::string> pread_all(int fd, size_t limit, long long offset) {
  std::string out;
  const bool ok = at_offset(fd, [&](HANDLE h) {
    while (out.size() < limit) {
      const size_t have = out.size();
      const DWORD want = static_cast<DWORD>(std::min<size_t>(limit - have, 1u << 30));
      out.resize(have + want);
      OVERLAPPED o = at(static_cast<unsigned long long>(offset) + have);
      DWORD n = 0;
      if (!ReadFile(h, out.data() + have, want, &n, &o) && GetLastError() != ERROR_HANDLE_EOF) {
        errno = EIO;
        return false;
      }
      out.resize(have + n);
      if (n < want) break;  // a regular file's short read is its end
    }
    return true;
  });
  if (!ok) return std::nullopt;
  return out;
}

std::optional<std::string> pread_some(int fd, size_t size, long long offset) {
  std::string out;
  const bool ok = at_offset(fd, [&](HANDLE h) {
    out.resize(std::min<size_t>(size, 1u << 30));
    OVERLAPPED o = at(static_cast<unsigned long long>(offset));
    DWORD n = 0;
    if (!ReadFile(h, out.data(), static_cast<DWORD>(out.size()), &n, &o) && GetLastError() != ERROR_HANDLE_EOF) {
      errno = EIO;
      return false;
    }
    out.resize(n);
    return true;
  });
  if (!ok) return std::nullopt;
  return out;
}

std::optional<std::string> read_file(const std::string& path, size_t limit) {
  const int fd = _wopen(windows::widen(path).c_str(), _O_RDONLY | _O_BINARY | _O_NOINHERIT);
  if (fd < 0) return std::nullopt;
  std::string out;
  while (out.size() < limit) {
    const size_t have = out.size();
    const unsigned want = static_cast<unsigned>(std::min<size_t>(limit - have, 1u << 20));
    out.resize(have + want);
    const int n = _read(fd, out.data() + have, want);
    if (n < 0) {
      const int err = errno;
      _close(fd);
      errno = err;
      return std::nullopt;
    }
    out.resize(have + static_cast<size_t>(n));
    if (n == 0) break;
  }
  _close(fd);
  return out;
}

// The C++ library's steady clock is QueryPerformanceCounter on Windows, a
// clock that never goes back and does not count sleep as a jump.
long long monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

long long realtime_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void nap_ns(long long ns) { Sleep(static_cast<DWORD>((ns + 999'999) / 1'000'000)); }

void sleep_until_ns(long long until_ns) {
  // The library's sleep_until can wake a little early under mingw-w64
  // (seen under wine: 0.3 ms); sleep on until the clock says so.
  for (long long now = monotonic_ns(); now < until_ns; now = monotonic_ns()) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(until_ns - now));
  }
}

std::optional<unsigned long long> random_below(unsigned long long bound) {
  // Rejection sampling, as on POSIX; the bytes are the system's preferred
  // generator's (BCryptGenRandom).
  const unsigned long long limit = ~0ULL - (~0ULL % bound);
  for (;;) {
    unsigned long long v = 0;
    if (BCryptGenRandom(nullptr, reinterpret_cast<PUCHAR>(&v), sizeof v, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) {
      errno = EIO;
      return std::nullopt;
    }
    if (v < limit) return v % bound;
  }
}

std::string path_in_dir(std::string_view dir, std::string_view name) {
  std::string p(dir);
  // A drive alone ("D:") is that drive's current directory: its names are
  // "D:name", as the system joins them ("D:\\name" is in its root).
  const bool drive_alone = p.size() == 2 && p[1] == ':';
  if (!p.empty() && !drive_alone && !is_path_separator(p.back())) p += '\\';
  return p += name;
}

bool is_path_separator(char c) { return c == '/' || c == '\\'; }

std::string_view program_suffix() { return ".exe"; }

// No exec, no signals, a lock never inherited (a byte-range lock is held by
// the handle, which no command gets), and no etcd transport built yet.
Abilities abilities() { return {}; }

Pid own_pid() { return static_cast<Pid>(GetCurrentProcessId()); }

// The RID of the user this process runs as (support.hpp's rid_of), from
// its token; when it cannot be read, a number no SID ends with.
Uid own_uid() {
  constexpr Uid kUnknown = static_cast<Uid>(0xfffffffeU);
  HANDLE token = nullptr;
  if (!OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &token)) return kUnknown;
  alignas(TOKEN_USER) unsigned char buf[sizeof(TOKEN_USER) + SECURITY_MAX_SID_SIZE];
  DWORD size = 0;
  const bool known = GetTokenInformation(token, TokenUser, buf, sizeof buf, &size) != 0;
  CloseHandle(token);
  return known ? static_cast<Uid>(windows::rid_of(reinterpret_cast<TOKEN_USER*>(buf)->User.Sid)) : kUnknown;
}

Uid own_euid() { return own_uid(); }

bool in_group(Gid) { return false; }

bool is_terminal(int fd) { return _isatty(fd) != 0; }

std::optional<int> terminal_width(int fd) {
  CONSOLE_SCREEN_BUFFER_INFO info{};
  const HANDLE h = reinterpret_cast<HANDLE>(_get_osfhandle(fd));
  if (h == INVALID_HANDLE_VALUE || !GetConsoleScreenBufferInfo(h, &info)) return std::nullopt;
  const int width = info.srWindow.Right - info.srWindow.Left + 1;
  return width > 0 ? std::optional<int>(width) : std::nullopt;
}

bool keep_from_commands(int fd) {
  const HANDLE h = reinterpret_cast<HANDLE>(_get_osfhandle(fd));
  if (h == INVALID_HANDLE_VALUE || !SetHandleInformation(h, HANDLE_FLAG_INHERIT, 0)) {
    errno = EBADF;
    return false;
  }
  return true;
}

std::optional<std::string> own_executable() {
  std::wstring path(MAX_PATH, L'\0');
  for (;;) {
    const DWORD n = GetModuleFileNameW(nullptr, path.data(), static_cast<DWORD>(path.size()));
    if (n == 0) return std::nullopt;
    if (n < path.size()) {
      path.resize(n);
      return windows::utf8(path);
    }
    if (path.size() >= 32768) return std::nullopt;  // the longest path Windows has
    path.resize(path.size() * 2);
  }
}

int execute_access(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(std::filesystem::path(windows::widen(path)), ec);
  if (ec || !std::filesystem::exists(st)) return ENOENT;
  return std::filesystem::is_regular_file(st) ? 0 : EACCES;
}

int exec_program(const std::string&, char**, const std::vector<std::string>&) { return ENOSYS; }

namespace windows {

namespace {
// Where GetFinalPathNameByHandleW gives no path (wine's reads the handle's
// name into a buffer of MAX_PATH characters: ERROR_MORE_DATA past about
// 263), the name it starts from, read into a buffer that fits any path
// (NtQueryObject): wine names a file in the DOS device namespace
// (\??\C:\..., \??\UNC\server\share\...), which is its \\?\ path. Windows
// names it by its device (\Device\HarddiskVolume1\...), which is not mapped
// here: there GetFinalPathNameByHandleW gives paths of any length.
std::optional<std::wstring> dos_object_name(HANDLE h) {
  using Query = LONG(NTAPI*)(HANDLE, OBJECT_INFORMATION_CLASS, PVOID, ULONG, PULONG);
  const HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
  const auto query =
      ntdll ? reinterpret_cast<Query>(reinterpret_cast<void*>(GetProcAddress(ntdll, "NtQueryObject"))) : nullptr;
  if (!query) return std::nullopt;
  std::vector<unsigned char> buf(sizeof(OBJECT_NAME_INFORMATION) + 65536);  // a name's length is 16 bits of bytes
  ULONG size = 0;
  if (query(h, ObjectNameInformation, buf.data(), static_cast<ULONG>(buf.size()), &size) < 0) return std::nullopt;
  const auto* info = reinterpret_cast<const OBJECT_NAME_INFORMATION*>(buf.data());
  if (!info->Name.Buffer) return std::nullopt;
  const std::wstring name(info->Name.Buffer, info->Name.Length / sizeof(wchar_t));
  if (!name.starts_with(L"\\??\\") || name.size() < 6) return std::nullopt;
  return L"\\\\?\\" + name.substr(4);
}
}  // namespace

std::optional<std::wstring> final_path(HANDLE h) {
  if (h == INVALID_HANDLE_VALUE) {
    errno = EBADF;
    return std::nullopt;
  }
  std::wstring buf(32768, L'\0');  // the longest path Windows has, and its NUL
  const DWORD n =
      GetFinalPathNameByHandleW(h, buf.data(), static_cast<DWORD>(buf.size()), FILE_NAME_NORMALIZED | VOLUME_NAME_DOS);
  const DWORD error = n == 0 ? GetLastError() : ERROR_MORE_DATA;
  if (n > 0 && n < buf.size()) {
    buf.resize(n);
    return buf;  // VOLUME_NAME_DOS: \\?\C:\... or \\?\UNC\...
  }
  if (auto name = dos_object_name(h)) return name;
  errno = errno_of(error);
  return std::nullopt;
}

}  // namespace windows

void close_fd(int fd) noexcept { _close(fd); }

std::optional<std::string> path_of_fd(int fd) {
  auto path = windows::final_path(reinterpret_cast<HANDLE>(_get_osfhandle(fd)));
  if (!path) return std::nullopt;
  std::string p = windows::utf8(*path);
  // Without the prefix: \\?\UNC\server\share\... is \\server\share\...,
  // \\?\C:\... is C:\...
  if (p.starts_with("\\\\?\\UNC\\")) return "\\\\" + p.substr(8);
  if (p.starts_with("\\\\?\\")) p.erase(0, 4);
  return p;
}

std::optional<std::string> real_path(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::canonical(std::filesystem::path(windows::widen(path)), ec);
  if (ec) {
    errno = ec.value();
    return std::nullopt;
  }
  return windows::utf8(p.wstring());
}

std::optional<std::string> working_dir() {
  std::error_code ec;
  const auto p = std::filesystem::current_path(ec);
  if (ec) return std::nullopt;
  return windows::utf8(p.wstring());
}

UniqueFd open_for_reading(const std::string& path) {
  return UniqueFd(_wopen(windows::widen(path).c_str(), _O_RDONLY | _O_BINARY | _O_NOINHERIT));
}

std::string host_name() {
  wchar_t buf[256] = {};
  DWORD size = sizeof buf / sizeof buf[0];
  if (!GetComputerNameExW(ComputerNameDnsHostname, buf, &size)) return "unknown";
  return windows::utf8(std::wstring(buf, size));
}

// Windows names a user by SID, not by number (own_uid() is 0): the name is
// the caller's logon name; another uid has none to look up.
std::string user_name(Uid uid) {
  wchar_t buf[UNLEN + 1] = {};
  DWORD size = UNLEN + 1;
  if (uid != own_uid() || !GetUserNameW(buf, &size) || size == 0) return std::to_string(uid);
  return windows::utf8(std::wstring(buf, size - 1));  // size counts the NUL
}

}  // namespace looplock::sys
