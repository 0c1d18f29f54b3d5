#include "nesting.hpp"

#include <charconv>

#include "procfs.hpp"
#include "sys.hpp"

namespace looplock {

namespace {
std::optional<long> to_long(const std::optional<std::string>& s) {
  if (!s || s->empty()) return std::nullopt;
  long v = 0;
  auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (ec != std::errc() || p != s->data() + s->size() || v < 0) return std::nullopt;
  return v;
}
}  // namespace

std::optional<OuterHolder> find_outer_holder(const EnvList& env, const struct stat& lock_file, bool exclusive,
                                             pid_t self) {
  auto pid = to_long(env_get(env, env_name::kHolderPid));
  auto fd = to_long(env_get(env, env_name::kHolderFd));
  if (!pid || !fd || *pid <= 0) return std::nullopt;
  OuterHolder h{static_cast<pid_t>(*pid), static_cast<int>(*fd)};
  if (!procfs::is_self_or_ancestor(h.pid, self)) return std::nullopt;
  if (!procfs::fd_holds_flock(h.pid, h.fd, lock_file, exclusive)) return std::nullopt;
  return h;
}

std::optional<int> inherited_lock_fd(const EnvList& env, const struct stat& lock_file) {
  auto fd = to_long(env_get(env, env_name::kFd));
  struct stat st {};
  if (!fd || *fd > 0x7fffffff || fstat(static_cast<int>(*fd), &st) != 0 || !sys::same_file(st, lock_file)) {
    return std::nullopt;
  }
  return static_cast<int>(*fd);
}

}  // namespace looplock
