// looplock: run a command while holding the lock of a loop directory.
// Everything lives in the looplock library; see app.cpp for the script.
#include "cli/app.hpp"
#include "os/arguments.hpp"

int main(int argc, char** argv, char** envp) {
  looplock::sys::ProgramText text(argc, argv, envp);  // as UTF-8 (os/arguments.hpp)
  return looplock::main_program(text.argc(), text.argv(), text.envp());
}
