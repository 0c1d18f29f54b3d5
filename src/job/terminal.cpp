#include "job/terminal.hpp"

#include <termios.h>
#include <unistd.h>

#include <initializer_list>

#include "base/duration.hpp"
#include "os/ids.hpp"

namespace looplock {

std::string wait_status_line(long long waited_ns, std::optional<long long> left_ns, const std::string& who,
                             const std::string& path, size_t width) {
  const std::string head = "looplock: waiting " + format_duration(waited_ns) + " (" +
                           (left_ns ? format_duration(*left_ns) + " left" : std::string("no deadline")) + ") for " +
                           who;
  const std::string on = " on ";
  if (head.size() + on.size() + path.size() <= width) return head + on + path;
  // The path's end (its loop dir and .state.lock) says the most: cut its start.
  const std::string cut = "...";
  const size_t room = width > head.size() + on.size() + cut.size() ? width - head.size() - on.size() - cut.size() : 0;
  if (room >= 12) return head + on + cut + path.substr(path.size() - room);
  if (head.size() <= width) return head;
  return head.substr(0, width);
}

Terminal Terminal::find() {
  Terminal t;
  for (int fd : {0, 1, 2}) {
    if (tcgetpgrp(fd) >= 0) {  // fails unless fd is our controlling terminal
      t.fd_ = fd;
      t.own_pgrp_ = getpgrp();
      break;
    }
  }
  return t;
}

bool Terminal::looplock_in_foreground() const { return fd_ >= 0 && tcgetpgrp(fd_) == own_pgrp_; }

bool Terminal::give_to(Pid pgid) const {
  if (!looplock_in_foreground()) return true;  // in the background: the terminal is not ours to give
  return tcsetpgrp(fd_, pgid) == 0;
}

void Terminal::take_back_from(Pid pgid) const {
  if (fd_ >= 0 && tcgetpgrp(fd_) == pgid) (void)tcsetpgrp(fd_, own_pgrp_);
}

bool Terminal::hung_up() const { return fd_ >= 0 && tcgetpgrp(fd_) < 0; }

}  // namespace looplock
