// The whole program: parse the command line, then --help, --version,
// --inspect, or a run (run.hpp), and leave as the run concluded: with its
// exit status, or like the command (dying of its signal). One top-level
// catch maps an error to its exit status.
#pragma once

#include "run/run.hpp"

namespace looplock {

// The whole program: parse, run, map errors to statuses. Returns only with an
// exit status (it may also exit or die of a signal like the command, or exec
// looplock-etcd when `cluster` is null and the cluster lock is asked for).
// `cluster`: the cluster lock, which looplock-etcd has (cli/main_etcd.cpp).
int main_program(int argc, char** argv, char** envp, LockKind* cluster = nullptr);

}  // namespace looplock
