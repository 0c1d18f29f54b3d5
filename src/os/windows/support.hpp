// What the Windows forms of src/os/ share: errno for a Windows error, a
// name in a directory open as a descriptor (Windows has no directory
// descriptors: the directory's path and the name), and text between the
// UTF-8 that looplock works in (its arguments, its environment, paths) and
// the UTF-16 of the system's *W calls, which every call here uses: the *A
// calls would read the narrow text in the system's code page instead.
#pragma once

// clang-format off
#include <windows.h>
#include <io.h>
// clang-format on

#include <cerrno>
#include <optional>
#include <string>

#include "os/sys.hpp"

namespace looplock::sys::windows {

// errno for what GetLastError() says.
inline int errno_of(DWORD error) {
  switch (error) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_NAME: return ENOENT;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS: return EEXIST;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION: return EACCES;
    case ERROR_WRITE_PROTECT: return EROFS;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    case ERROR_LOCK_VIOLATION:
    case ERROR_IO_PENDING: return EWOULDBLOCK;
    case ERROR_TOO_MANY_OPEN_FILES: return EMFILE;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY: return ENOMEM;
    case ERROR_DIRECTORY: return ENOTDIR;
    case ERROR_NOT_SUPPORTED:
    case ERROR_CALL_NOT_IMPLEMENTED:
    case ERROR_INVALID_FUNCTION: return ENOSYS;
    case ERROR_INVALID_PARAMETER: return EINVAL;
    default: return EIO;
  }
}

// Sets errno from GetLastError(); false, for `return failed();`.
inline bool failed() {
  errno = errno_of(GetLastError());
  return false;
}

// UTF-8 `text` as UTF-16; text that is not UTF-8 has its bad bytes
// replaced by U+FFFD (Windows has no name that holds them).
inline std::wstring widen(const std::string& text) {
  if (text.empty()) return std::wstring();
  const int n = MultiByteToWideChar(CP_UTF8, 0, text.data(), static_cast<int>(text.size()), nullptr, 0);
  if (n <= 0) return std::wstring();
  std::wstring out(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, text.data(), static_cast<int>(text.size()), out.data(), n);
  return out;
}

// The path the system knows the file or directory open as `h` by, in the
// \\?\ form that *W calls take as it is (\\?\C:\..., \\?\UNC\server\share\...):
// GetFinalPathNameByHandleW's normalized DOS path (sys.cpp); nullopt (errno
// set) when it has none.
std::optional<std::wstring> final_path(HANDLE h);

// `name` in the directory open as `dirfd`, as a path for a *W call that
// opens, looks at, renames or removes it: always in \\?\ form (final_path),
// so that Windows' rewriting of a path (a part's trailing dots and spaces
// dropped, the MAX_PATH limit) never names another file than the one in
// that directory (wine drops them from the path it gives a directory, where
// Windows keeps them: a tests/windows skip says so). "." is the directory
// itself (a \\?\ path is taken as it is: "." in it would be a name).
// nullopt (errno set) when the directory has no path or `name` is not a
// plain name.
inline std::optional<std::wstring> path_in(int dirfd, const std::string& name) {
  auto dir = final_path(reinterpret_cast<HANDLE>(_get_osfhandle(dirfd)));
  if (!dir) {
    errno = EBADF;
    return std::nullopt;
  }
  if (name == ".") return dir;
  if (name.empty() || name == ".." || name.find_first_of("\\/") != std::string::npos) {
    errno = EINVAL;
    return std::nullopt;
  }
  if (!dir->ends_with(L'\\')) *dir += L'\\';
  return *dir += widen(name);
}

// `wide` in the code page `page` (CP_UTF8, but for a caller that needs
// the system's code page); nullopt when it cannot be converted.
inline std::optional<std::string> narrow(const std::wstring& wide, UINT page) {
  if (wide.empty()) return std::string();
  const int n = WideCharToMultiByte(page, 0, wide.data(), static_cast<int>(wide.size()), nullptr, 0, nullptr, nullptr);
  if (n <= 0) return std::nullopt;
  std::string out(static_cast<size_t>(n), '\0');
  WideCharToMultiByte(page, 0, wide.data(), static_cast<int>(wide.size()), out.data(), n, nullptr, nullptr);
  return out;
}

// `path` for a *W call that opens, renames or removes a file: a full path
// of 248 characters or more (MAX_PATH, 260, less the 12 that a directory's
// path leaves free for a file name) goes with the \\?\ prefix (\\?\UNC\ for
// a share), which lifts that limit but takes the path as it is, so its
// separators are made backslashes first. Shorter and relative paths are
// passed as they are.
inline std::wstring file_path(const std::string& path) {
  std::wstring w = widen(path);
  const bool drive = w.size() >= 3 && w[1] == L':' && (w[2] == L'\\' || w[2] == L'/');
  const bool share = w.size() >= 2 && (w[0] == L'\\' || w[0] == L'/') && (w[1] == L'\\' || w[1] == L'/');
  if (w.size() < MAX_PATH - 12 || !(drive || share) || w.starts_with(L"\\\\?\\")) return w;
  for (auto& c : w) {
    if (c == L'/') c = L'\\';
  }
  return drive ? L"\\\\?\\" + w : L"\\\\?\\UNC\\" + w.substr(2);
}

// A user's number on Windows, where users are SIDs: the SID's last
// sub-authority, its relative id (RID: 500 and up for a local or domain
// user, 544 for BUILTIN\\Administrators); 0 when `sid` is none.
inline unsigned rid_of(PSID sid) {
  if (sid == nullptr || !IsValidSid(sid)) return 0;
  const UCHAR n = *GetSidSubAuthorityCount(sid);
  return n == 0 ? 0 : static_cast<unsigned>(*GetSidSubAuthority(sid, n - 1));
}

// `wide` as UTF-8 (an unpaired surrogate becomes U+FFFD).
inline std::string utf8(const std::wstring& wide) { return narrow(wide, CP_UTF8).value_or(std::string()); }

}  // namespace looplock::sys::windows
