// The controlling terminal on POSIX, when looplock has one: looplock runs the command
// as a job of its own on it, as an interactive shell does (bash's jobs.c,
// dash's jobs.c). The job leads its own process group; while looplock is the
// terminal's foreground job, the command's group is made the foreground one,
// so ^C, ^\ and ^Z reach the command's processes once, straight from the
// terminal, and a signal sent to looplock's process group reaches only
// looplock (which forwards it, once). When the job stops, looplock takes the
// terminal back and stops itself the same way, so the shell above sees the
// job stopped; when looplock is continued (fg, bg), it continues the job and
// gives it the terminal again if looplock is in the foreground.
#pragma once

#include "os/ids.hpp"

namespace looplock::sys {

class Terminal {
public:
  // The controlling terminal among fds 0, 1 and 2 (tcgetpgrp(3) succeeds
  // only on it), or none.
  static Terminal find();

  bool present() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Whether looplock's process group is the terminal's foreground group now.
  bool looplock_in_foreground() const;
  // Makes `pgid` the foreground group if looplock's group is (SIGTTOU must
  // be blocked: the caller blocks every signal while the command runs).
  // Async-signal-safe. Returns false (errno set) when tcsetpgrp fails.
  bool give_to(Pid pgid) const;
  // Takes the terminal back for looplock's group if `pgid` has it.
  void take_back_from(Pid pgid) const;
  // Whether the terminal has hung up (it is no longer looplock's
  // controlling terminal: tcgetpgrp fails).
  bool hung_up() const;

private:
  int fd_ = -1;
  Pid own_pgrp_ = 0;
};

}  // namespace looplock::sys
