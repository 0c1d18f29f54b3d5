#include "os/file_watch.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace looplock::sys {

struct CloseWatch::Alarm {
  struct sigaction old {};
  sigset_t old_mask{};
};

CloseWatch::CloseWatch(int dirfd, const std::vector<std::string>& names, bool absorb_alarm)
    : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (absorb_alarm) {
    auto a = std::make_unique<Alarm>();
    struct sigaction sa {};
    sa.sa_handler = [](int) {};  // a SIGALRM ends poll(2) early (EINTR); the caller looks again
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, &a->old) == 0) {
      sigset_t alrm;
      sigemptyset(&alrm);
      sigaddset(&alrm, SIGALRM);
      sigprocmask(SIG_UNBLOCK, &alrm, &a->old_mask);
      alarm_ = std::move(a);
    }
  }
  if (!fd_) return;
  // By the directory descriptor, whatever DIR's path has become since.
  const std::string dir = "/proc/self/fd/" + std::to_string(dirfd) + "/";
  bool any = false;
  for (const auto& n : names) any = inotify_add_watch(fd_.get(), (dir + n).c_str(), IN_CLOSE) >= 0 || any;
  if (!any) fd_.reset();
}

CloseWatch::~CloseWatch() {
  if (!alarm_) return;
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  sigprocmask(SIG_BLOCK, &alrm, nullptr);
  timespec zero{};
  while (sigtimedwait(&alrm, nullptr, &zero) > 0) {
  }
  sigaction(SIGALRM, &alarm_->old, nullptr);
  sigprocmask(SIG_SETMASK, &alarm_->old_mask, nullptr);
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
