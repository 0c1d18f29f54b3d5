#include "os/file_watch.hpp"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace looplock::sys {

CloseWatch::CloseWatch(int dirfd, const std::vector<std::string>& names)
    : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (!fd_) return;
  // By the directory descriptor, whatever DIR's path has become since.
  const std::string dir = "/proc/self/fd/" + std::to_string(dirfd) + "/";
  bool any = false;
  for (const auto& n : names) any = inotify_add_watch(fd_.get(), (dir + n).c_str(), IN_CLOSE) >= 0 || any;
  if (!any) fd_.reset();
}

void CloseWatch::wait(Duration at_most) {
  const auto ms = std::clamp<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(at_most + std::chrono::microseconds(999)).count(), 0,
      INT_MAX);
  if (!fd_) {
    (void)poll(nullptr, 0, static_cast<int>(ms));
    return;
  }
  pollfd p{.fd = fd_.get(), .events = POLLIN, .revents = 0};
  if (poll(&p, 1, static_cast<int>(ms)) <= 0) return;
  alignas(inotify_event) char buf[4096];
  while (read(fd_.get(), buf, sizeof buf) > 0) {
  }
}

}  // namespace looplock::sys
