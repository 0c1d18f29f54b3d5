// What each of looplock's commands (cli/app.cpp's table: --help, --version,
// --completions, --inspect, --release, --hold, a run) is handed once the
// command line is parsed.
#pragma once

#include <optional>

#include "run/notify.hpp"
#include "run/run.hpp"

namespace looplock {

struct Session {
  char** argv = nullptr;  // as main() got it (the hand-off to looplock-etcd execs it again)
  Context& ctx;
  Options& options;
  Logger& log;
  // --notify's relay, which outlives the command so that an error's event
  // reaches it too (app.cpp finishes it).
  std::optional<Notifier>& notifier;
  RunFacts& facts;  // what the run got to (metrics, the error's event)
  long long start_wall_ms = 0;
};

// A command: its exit status (it may also exit, or die of a signal, like
// the command it ran).
using Command = int (*)(Session&);

}  // namespace looplock
