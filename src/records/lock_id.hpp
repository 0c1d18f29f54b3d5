// The stable identity of a lock: the first 16 hex digits of the SHA-256 of
// the lock file's canonical absolute path. Any tool can compute it; it never
// reveals the path.
#pragma once

#include <string>
#include <string_view>

namespace looplock {

std::string lock_id_for_path(std::string_view canonical_lock_path);

// "/a/b/../c/." -> "/a/c": "." and ".." removed without asking the file
// system (for a path it cannot resolve).
std::string lexically_normal(std::string_view absolute_path);

// realpath(DIR) + "/.state.lock" (DIR's absolute spelling, lexically
// normalised, if it cannot be resolved).
std::string canonical_lock_path(const std::string& dir);
// The same for a DIR already open as `dirfd`: one readlink(2) of
// /proc/self/fd/N, falling back to canonical_lock_path(dir).
std::string canonical_lock_path(int dirfd, const std::string& dir);

// The lock as a run names it: DIR's canonical path, the lock's lock_id, and
// DIR's base name ("/" for the root directory).
struct LockTarget {
  std::string canonical_dir;
  std::string lock_id;
  std::string loop;
};
LockTarget target_of(int dirfd, const std::string& given_dir);

}  // namespace looplock
