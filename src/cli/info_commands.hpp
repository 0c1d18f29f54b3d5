// The commands that only print: --help, --version, --completions SHELL.
#pragma once

#include "cli/session.hpp"

namespace looplock {

int help_command(Session& s);
int version_command(Session& s);
int completions_command(Session& s);

}  // namespace looplock
