// A run (looplock DIR -- COMMAND, and a hold's holder once it holds): the
// notifier, the run's script (run/run.hpp) and the metrics; and how a run
// that ended in an error ends.
#pragma once

#include "base/error.hpp"
#include "cli/session.hpp"

namespace looplock {

int run_command(Session& s);
// --hold: the caller returns once the holder holds the lock; the holder
// goes on as a run (run_command).
int hold_command(Session& s);

// A run that ended in an error: said, then --notify's ended and the
// metrics; an ending signal a coalescing seat held back ends looplock then.
// Its exit status.
int ended_in_error(const Fatal& e, const Logger& log, const Options* o, bool notifying, const RunFacts& facts,
                   long long start_wall_ms);

}  // namespace looplock
