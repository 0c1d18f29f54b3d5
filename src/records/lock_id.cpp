#include "records/lock_id.hpp"

#include <climits>
#include <cstdlib>
#include <memory>
#include <vector>

#include <unistd.h>

#include "os/digest.hpp"
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
  char buf[PATH_MAX + 1];
  // One readlink(2) of the open descriptor: the canonical path that names
  // the lock (its lock_id, $LOOPLOCK_DIR), without realpath(3)'s walk.
  std::string link = "/proc/self/fd/" + std::to_string(dirfd);
  ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  // The kernel's name for a removed directory ends in " (deleted)"; anything
  // not absolute is not a path.
  if (n > 0 && n < static_cast<ssize_t>(sizeof buf) - 1 && buf[0] == '/') {
    std::string p(buf, static_cast<size_t>(n));
    if (!p.ends_with(" (deleted)")) {
      if (p.back() != '/') p += '/';
      return p + kLockName;
    }
  }
  return canonical_lock_path(dir);
}

std::string canonical_lock_path(const std::string& dir) {
  std::unique_ptr<char, decltype(&std::free)> real(realpath(dir.c_str(), nullptr), &std::free);
  std::string p;
  if (real) {
    p = real.get();
  } else {
    // DIR was opened but cannot be resolved (a parent lost its search
    // permission?): fall back to its absolute spelling.
    if (!dir.starts_with('/')) {
      std::unique_ptr<char, decltype(&std::free)> cwd(getcwd(nullptr, 0), &std::free);
      if (cwd) p = std::string(cwd.get()) + "/";
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
  const auto slash = t.canonical_dir.rfind('/');
  t.loop = slash == std::string::npos ? t.canonical_dir : t.canonical_dir.substr(slash + 1);
  if (t.loop.empty()) t.loop = "/";
  return t;
}

}  // namespace looplock
