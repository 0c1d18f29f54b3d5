// arguments.hpp on POSIX: the arguments and environment are bytes, taken
// as they are.
#include "os/arguments.hpp"

namespace looplock::sys {

ProgramText::ProgramText(int argc, char** argv, char** envp) : argv_(argv, argv + argc + 1) {
  size_t n = 0;
  while (envp && envp[n]) ++n;
  envp_.assign(envp, envp + n);
  envp_.push_back(nullptr);
}

}  // namespace looplock::sys
