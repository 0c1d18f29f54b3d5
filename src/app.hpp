// The run of one looplock: main() builds the context and calls run(); run()
// reads as the tool's script (open DIR, take the lock under the policy,
// record the holder, run the command, release, leave as the command left).
#pragma once

#include <sys/types.h>

#include "environment.hpp"
#include "log.hpp"
#include "metrics.hpp"
#include "options.hpp"

namespace looplock {

namespace etcd {
class Transport;
}

struct Context {
  EnvList env;  // the environment looplock was started with
  pid_t pid = 0;
  long long start_ns = 0;  // CLOCK_MONOTONIC when looplock started
  // The cluster lock's HTTP exchange: libcurl's in looplock-etcd, null in
  // looplock, which hands runs with --etcd to looplock-etcd (cluster_exec.hpp).
  etcd::Transport* etcd = nullptr;
};

// How looplock ends: with an exit status, or like a wait status (exit N, or
// die of the signal that killed the command).
struct Outcome {
  enum class Kind { ExitStatus, LikeWaitStatus };
  Kind kind = Kind::ExitStatus;
  int value = 0;
};

// What a run came to, for the metrics (--metrics-dir): filled in by run() as
// it learns it (the lock_id stays empty when the run ended before).
struct RunFacts {
  std::string lock_id;
  std::string loop;  // DIR's base name
  long long waited_ns = 0;
  long long ran_ns = 0;  // the command's run
  std::optional<RunOutcome> outcome;  // unset: an error
};

Outcome run(const Options& options, const Context& context, const Logger& log, RunFacts& facts);

// The whole program: parse, run, map errors to statuses. Returns only with an
// exit status (it may also exit or die of a signal like the command, or exec
// looplock-etcd when `etcd` is null and the cluster lock is asked for).
int main_program(int argc, char** argv, char** envp, etcd::Transport* etcd = nullptr);

}  // namespace looplock
