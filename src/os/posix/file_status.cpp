// file_status.hpp on POSIX.
#include "os/file_status.hpp"

#include <fcntl.h>
#include <sys/stat.h>

namespace looplock::sys {

namespace {
FileStatus from(const struct stat& st) {
  return FileStatus{.device = st.st_dev,
                    .inode = st.st_ino,
                    .mode = st.st_mode,
                    .links = st.st_nlink,
                    .owner = st.st_uid,
                    .group = st.st_gid,
                    .size = st.st_size};
}
}  // namespace

bool status_of_fd(int fd, FileStatus& out) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  out = from(st);
  return true;
}

bool status_of_path(const std::string& path, FileStatus& out) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return false;
  out = from(st);
  return true;
}

bool status_at(int dirfd, const char* name, FileStatus& out) {
  struct stat st {};
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  out = from(st);
  return true;
}

}  // namespace looplock::sys
