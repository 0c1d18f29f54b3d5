// The whole program: parse the command line, then --help, --version,
// --inspect, or a run (run.hpp), and leave as the run concluded: with its
// exit status, or like the command (dying of its signal). One top-level
// catch maps an error to its exit status.
#pragma once

#include <sys/types.h>

#include "run.hpp"

namespace looplock {

namespace etcd {
class Transport;
}

// The whole program: parse, run, map errors to statuses. Returns only with an
// exit status (it may also exit or die of a signal like the command, or exec
// looplock-etcd when `etcd` is null and the cluster lock is asked for).
int main_program(int argc, char** argv, char** envp, etcd::Transport* etcd = nullptr);

}  // namespace looplock
