// file_status.hpp on Windows: the C runtime's stat, whose mode numbers the
// type as POSIX does (_S_IFREG, _S_IFDIR) and whose owner is always 0 (a
// Windows file is owned by a SID, not a number). The identity is the
// volume's serial number and the file's index, as GetFileInformationByHandle
// gives them; a path is opened for that without access rights, sharing all.
// status_at has no Windows form: there are no directory descriptors.
// windows.h first: io.h needs nothing of it, but the order is the usual one.
// clang-format off
#include <windows.h>
#include <io.h>
#include <sys/stat.h>
#include <sys/types.h>
// clang-format on

#include "os/file_status.hpp"

namespace looplock::sys {

namespace {
bool identify(HANDLE h, FileStatus& out) {
  BY_HANDLE_FILE_INFORMATION info{};
  if (h == INVALID_HANDLE_VALUE || !GetFileInformationByHandle(h, &info)) return false;
  out.device = info.dwVolumeSerialNumber;
  out.inode = (static_cast<unsigned long long>(info.nFileIndexHigh) << 32) | info.nFileIndexLow;
  out.links = info.nNumberOfLinks;
  return true;
}

void take(const struct _stat64& st, FileStatus& out) {
  out.mode = st.st_mode;
  out.size = st.st_size;
  out.links = st.st_nlink;
}
}  // namespace

bool status_of_fd(int fd, FileStatus& out) {
  struct _stat64 st {};
  if (_fstat64(fd, &st) != 0) return false;
  out = FileStatus{};
  take(st, out);
  identify(reinterpret_cast<HANDLE>(_get_osfhandle(fd)), out);
  return true;
}

bool status_of_path(const std::string& path, FileStatus& out) {
  struct _stat64 st {};
  if (_stat64(path.c_str(), &st) != 0) return false;
  out = FileStatus{};
  take(st, out);
  const HANDLE h = CreateFileA(path.c_str(), 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                               OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h != INVALID_HANDLE_VALUE) {
    identify(h, out);
    CloseHandle(h);
  }
  return true;
}

}  // namespace looplock::sys
