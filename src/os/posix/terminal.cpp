#include "os/posix/terminal.hpp"

#include <termios.h>
#include <unistd.h>

#include <initializer_list>

#include "os/ids.hpp"

namespace looplock::sys {

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

}  // namespace looplock::sys
