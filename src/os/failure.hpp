// The one recoverable error, beside base/error.hpp's Fatal (the one that
// ends a run): what failed, in the operator's words, the errno it failed
// with, a hint, and whose step it was. The operating system's layer returns
// it as data (it sits below Fatal and cannot throw one); a caller that
// cannot go on turns it into a Fatal with fail() (base/error.hpp), one that
// can go on words it as a warning.
#pragma once

#include <string>

namespace looplock::sys {

struct Failure {
  // Whose step failed: looplock's own (a system call it needed), or the
  // command's (its exec: looplock exits 126, or 127 when the command was not
  // found, and the caller words the message with the command's name).
  enum class Of { Looplock, Command };
  std::string what{};  // "cannot block signals to run the command"
  int err = 0;         // errno; 0: none
  std::string hint{};
  Of of = Of::Looplock;
};

}  // namespace looplock::sys
