// looplock: run a command while holding the lock of a loop directory.
// Everything lives in the looplock library; see app.cpp for the script.
#include "cli/app.hpp"

int main(int argc, char** argv, char** envp) { return looplock::main_program(argc, argv, envp); }
