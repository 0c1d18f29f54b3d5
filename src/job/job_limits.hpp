// The limits looplock puts on a command's job, resolved once from
// --kill-after, --max-time, --warn-before and --warn-signal (cli/options.cpp),
// and held whole by the settings (settings.hpp) and by the job's spec
// (job/job.hpp's CommandSpec). A new job deadline is a field here, its
// option in cli/option_table.cpp, and its rule in src/job/.
#pragma once

#include <optional>
#include <string>

#include "os/clock.hpp"

namespace looplock {

// The KILL after --max-time's TERM when --kill-after is not given.
inline constexpr Duration kDefaultKillAfter = std::chrono::seconds(5);

struct JobLimits {
  // KILL the job this long after looplock forwarded it a TERM or INT
  // (nullopt: never, as timeout(1) without -k).
  std::optional<Duration> kill_after;
  // --max-time: TERM the job once it has run this long (nullopt: no limit),
  // then KILL it max_time_kill_after later (--kill-after, or
  // kDefaultKillAfter when it was not given; nullopt: never).
  std::optional<Duration> max_time;
  std::optional<Duration> max_time_kill_after;
  // Where max_time comes from when it is not the run's own --max-time (a
  // hold's end, for a later step of it: "the hold's --max-time (its end at
  // T)"); empty: --max-time.
  std::string max_time_from;
  // --warn-before: send `warn_signal` once to each process of the job that
  // catches it, this long before --max-time's TERM, or (a lease's renewals
  // failing) before its TERM (os/job_control.hpp's JobWarning). The command line sets the
  // signal (USR1 unless --warn-signal, cli/options.cpp): a system's number.
  std::optional<Duration> warn_before;
  int warn_signal = 0;
};

}  // namespace looplock
