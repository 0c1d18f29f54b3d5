// looplock's own arguments and environment as UTF-8 text, the form every
// other part of it works in. posix/: what main() is given, as it is (no
// copy); windows/: read again from the system's UTF-16 command line
// (CommandLineToArgvW) and environment block, since the C runtime's narrow
// argv and environ are in the system's code page, which cannot hold every
// name.
#pragma once

#include <string>
#include <vector>

namespace looplock::sys {

class ProgramText {
public:
  ProgramText(int argc, char** argv, char** envp);
  int argc() const { return static_cast<int>(argv_.size()) - 1; }
  char** argv() { return argv_.data(); }
  char** envp() { return envp_.data(); }

private:
  std::vector<std::string> text_;  // windows/: the converted strings the pointers point into
  std::vector<char*> argv_;        // each ends with a null pointer
  std::vector<char*> envp_;
};

}  // namespace looplock::sys
