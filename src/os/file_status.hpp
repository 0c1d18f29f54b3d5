// A file's status as looplock judges it: who owns it, its type and mode, its
// links and size, and its identity. Each system's code reads it
// (posix/file_status.cpp: fstat(2) and fstatat(2); windows/: the C
// runtime's _fstat64 and _stat64).
#pragma once

#include <string>

#include "os/ids.hpp"

namespace looplock::sys {

struct FileStatus {
  unsigned long long device = 0;  // with `inode`, the file's identity
  unsigned long long inode = 0;
  bool identified = true;  // false where the system could not say (windows/: a pipe, NUL)
  // Its type and permission bits, numbered as POSIX numbers them
  // (S_IFREG | 0660). windows/: the type and the owner's bits only; access
  // there is by ACL, and no group or other bits are said.
  unsigned mode = 0;
  unsigned long long links = 0;
  Uid owner = 0;
  Gid group = 0;
  long long size = 0;

  bool regular() const { return type() == 0100000; }
  bool directory() const { return type() == 0040000; }
  bool symlink() const { return type() == 0120000; }
  bool fifo() const { return type() == 0010000; }
  bool socket() const { return type() == 0140000; }
  bool char_device() const { return type() == 0020000; }
  bool block_device() const { return type() == 0060000; }
  unsigned type() const { return mode & 0170000; }
};

// FileStatus::mode's permission bits, as POSIX numbers them.
namespace mode {
inline constexpr unsigned kSticky = 01000;
inline constexpr unsigned kGroupRead = 0040;
inline constexpr unsigned kGroupWrite = 0020;
inline constexpr unsigned kOtherRead = 0004;
inline constexpr unsigned kOtherWrite = 0002;
}  // namespace mode

// Whether two statuses are of the same file; never for a file whose
// identity is unknown.
inline bool same_file(const FileStatus& a, const FileStatus& b) {
  return a.identified && b.identified && a.device == b.device && a.inode == b.inode;
}

// The status of the open descriptor `fd`; false (errno set) when it cannot
// be had.
bool status_of_fd(int fd, FileStatus& out);
// The status of the file `path` names, links followed.
bool status_of_path(const std::string& path, FileStatus& out);
// The status of `name` in the directory open as `dirfd` (files.hpp's
// open_directory), of the link itself when it is one.
bool status_at(int dirfd, const char* name, FileStatus& out);

}  // namespace looplock::sys
