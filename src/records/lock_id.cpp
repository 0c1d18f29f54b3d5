#include "records/lock_id.hpp"

#include <vector>

#include "os/digest.hpp"
#include "os/sys.hpp"
#include "records/lockfile.hpp"

namespace looplock {

std::string lock_id_for_path(std::string_view canonical_lock_path) {
  return sys::sha256_hex(canonical_lock_path).substr(0, 16);
}

std::string lexically_normal(std::string_view path) {
  std::vector<std::string_view> parts;
  while (!path.empty()) {
    auto slash = path.find('/');
    std::string_view part = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (auto part : parts) {
    out += '/';
    out += part;
  }
  return out.empty() ? "/" : out;
}

std::string canonical_lock_path(int dirfd, const std::string& dir) {
  // The path the system knows the open descriptor by: the canonical path
  // that names the lock (its lock_id, $LOOPLOCK_DIR), without realpath(3)'s
  // walk.
  if (auto p = sys::path_of_fd(dirfd)) return sys::path_in_dir(*p, kLockName);
  return canonical_lock_path(dir);
}

std::string canonical_lock_path(const std::string& dir) {
  std::string p;
  if (auto real = sys::real_path(dir)) {
    p = *real;
  } else {
    // DIR was opened but cannot be resolved (a parent lost its search
    // permission?): fall back to its absolute spelling.
    if (!dir.starts_with('/')) {
      if (auto cwd = sys::working_dir()) p = *cwd + "/";
    }
    p += dir;
    p = lexically_normal(p);
  }
  if (p.back() != '/') p += '/';
  return p + kLockName;
}

LockTarget target_of(int dirfd, const std::string& given_dir) {
  const std::string canonical = canonical_lock_path(dirfd, given_dir);
  LockTarget t;
  t.canonical_dir = canonical.substr(0, canonical.size() - std::string_view(kLockName).size() - 1);
  t.lock_id = lock_id_for_path(canonical);
  size_t base = t.canonical_dir.size();
  while (base > 0 && !sys::is_path_separator(t.canonical_dir[base - 1])) --base;
  t.loop = t.canonical_dir.substr(base);
  if (t.loop.empty()) t.loop = t.canonical_dir.empty() ? "/" : t.canonical_dir;  // the root
  return t;
}

}  // namespace looplock
