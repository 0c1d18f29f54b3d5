// os/interrupts.hpp on POSIX: the signals whose pending ends a wait.
#pragma once

#include <signal.h>

namespace looplock::sys {

struct Interrupts {
  sigset_t signals;
};

}  // namespace looplock::sys
