// A file's identity on POSIX (device and inode), for the code that still
// holds a struct stat (src/posix_bound.txt).
#pragma once

#include <sys/stat.h>

namespace looplock::sys {

inline bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace looplock::sys
