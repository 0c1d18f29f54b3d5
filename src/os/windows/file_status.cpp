// file_status.hpp on Windows: the C runtime's stat, whose mode numbers the
// type as POSIX does (_S_IFREG, _S_IFDIR) but copies the owner's bits to the
// group's and others' (Microsoft's _stat documentation), so only the type
// and the owner's bits are kept. Its owner is the RID of the owner's SID
// (support.hpp's rid_of), as own_euid() is the caller's. The identity is the volume's serial number
// and the file's 64-bit index, as GetFileInformationByHandle gives them (on
// ReFS only FILE_ID_INFO's 128 bits are unique: not handled yet); a path is
// opened for that without access rights, sharing all. A file without one (a
// pipe, NUL) is not identified, and is the same file as none. status_at
// reaches the name through the path the system knows the directory by
// (there are no directory descriptors), and says what is at the name
// itself: a symbolic link (or junction) is one, not its target.
// windows.h first: io.h needs nothing of it, but the order is the usual one.
// clang-format off
#include <windows.h>
#include <aclapi.h>
#include <io.h>
#include <sys/stat.h>
#include <sys/types.h>
// clang-format on

#include "os/file_status.hpp"

#include <cerrno>

#include "os/sys.hpp"
#include "os/windows/support.hpp"

namespace looplock::sys {

namespace {
// The owner of the file open as `h`, as a number (support.hpp's rid_of): a
// file that BUILTIN\Administrators owns counts as the caller's when the
// caller is an elevated administrator (the files such a caller creates are
// owned by that group). An owner that cannot be read is nobody's (a run
// refuses the file), but a file system that keeps no owner (FAT) gives
// every file to the caller.
constexpr Uid kUnknownOwner = static_cast<Uid>(0xfffffffdU);
Uid owner_of(HANDLE h) {
  PSID owner = nullptr;
  PSECURITY_DESCRIPTOR sd = nullptr;
  if (h == INVALID_HANDLE_VALUE || GetSecurityInfo(h, SE_FILE_OBJECT, OWNER_SECURITY_INFORMATION, &owner, nullptr,
                                                   nullptr, nullptr, &sd) != ERROR_SUCCESS) {
    return kUnknownOwner;
  }
  if (owner == nullptr) {
    LocalFree(sd);
    return own_euid();
  }
  Uid uid = static_cast<Uid>(windows::rid_of(owner));
  if (IsWellKnownSid(owner, WinBuiltinAdministratorsSid)) {
    BOOL member = FALSE;
    if (CheckTokenMembership(nullptr, owner, &member) && member) uid = own_euid();
  }
  LocalFree(sd);
  return uid;
}

// What the C runtime's stat says, with the identity and the owner of the
// file open as `h` where the system has them.
FileStatus from(const struct _stat64& st, HANDLE h) {
  FileStatus out;
  out.mode = st.st_mode & (_S_IFMT | 0700);
  out.owner = owner_of(h);
  out.size = st.st_size;
  out.links = st.st_nlink;
  BY_HANDLE_FILE_INFORMATION info{};
  out.identified = h != INVALID_HANDLE_VALUE && GetFileInformationByHandle(h, &info);
  if (out.identified) {
    out.device = info.dwVolumeSerialNumber;
    out.inode = (static_cast<unsigned long long>(info.nFileIndexHigh) << 32) | info.nFileIndexLow;
    out.links = info.nNumberOfLinks;
  }
  return out;
}
}  // namespace

bool status_of_fd(int fd, FileStatus& out) {
  struct _stat64 st {};
  if (_fstat64(fd, &st) != 0) return false;
  out = from(st, reinterpret_cast<HANDLE>(_get_osfhandle(fd)));
  return true;
}

bool status_of_path(const std::string& given, FileStatus& out) {
  // The C runtime's stat fails on a directory named with a trailing
  // separator ("loop\\"), which every Windows tool writes: it is stripped,
  // but from a root ("C:\\", "\\"). It fails on a drive alone ("D:", that
  // drive's current directory) too, which is named "D:." for it.
  std::string path = given;
  while (path.size() > 1 && (path.back() == '\\' || path.back() == '/') && !(path.size() == 3 && path[1] == ':')) {
    path.pop_back();
  }
  if (path.size() == 2 && path[1] == ':') path += '.';
  struct _stat64 st {};
  if (_wstat64(windows::file_path(path).c_str(), &st) != 0) return false;
  const HANDLE h = CreateFileW(windows::file_path(path).c_str(), READ_CONTROL,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                               FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  out = from(st, h);
  if (h != INVALID_HANDLE_VALUE) CloseHandle(h);
  return true;
}

bool status_at(int dirfd, const char* name, FileStatus& out) {
  const auto path = windows::path_in(dirfd, name);
  if (!path) return false;
  const HANDLE h = CreateFileW(path->c_str(), FILE_READ_ATTRIBUTES | READ_CONTROL,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                               FILE_FLAG_BACKUP_SEMANTICS | FILE_FLAG_OPEN_REPARSE_POINT, nullptr);
  if (h == INVALID_HANDLE_VALUE) return windows::failed();
  BY_HANDLE_FILE_INFORMATION info{};
  const bool known = GetFileInformationByHandle(h, &info);
  const Uid owner = owner_of(h);
  CloseHandle(h);
  if (!known) {
    errno = EIO;
    return false;
  }
  out = FileStatus{};
  const unsigned type = (info.dwFileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) ? 0120000
                        : (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)   ? 0040000
                                                                               : 0100000;
  // The read-only attribute of a directory says nothing of its files (it
  // marks a customised folder): a directory's owner bits are always 0700.
  const bool read_only = type == 0100000 && (info.dwFileAttributes & FILE_ATTRIBUTE_READONLY);
  out.mode = type | 0400 | (read_only ? 0 : 0200) | (type == 0040000 ? 0100 : 0);
  out.device = info.dwVolumeSerialNumber;
  out.inode = (static_cast<unsigned long long>(info.nFileIndexHigh) << 32) | info.nFileIndexLow;
  out.links = info.nNumberOfLinks;
  out.size = static_cast<long long>((static_cast<unsigned long long>(info.nFileSizeHigh) << 32) | info.nFileSizeLow);
  out.owner = owner;
  return true;
}

}  // namespace looplock::sys
