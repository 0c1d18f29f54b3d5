// What the job loop (job_loop.cpp) does next: a pure function of the job's
// deadlines and the time, so that the deadline rules looplock adds to a
// command (--kill-after, --max-time, the lease's TERM and its renewals, the
// warning before them) are tested without processes. Each deadline may be
// none (os/clock.hpp).
#pragma once

#include "os/clock.hpp"

namespace looplock {

struct JobDeadlines {
  Deadline kill_at{};        // KILL the job's group (--kill-after after a TERM, or the lease's)
  Deadline warn_at{};        // send the job the warning signal (--warn-before), once
  Deadline max_time_at{};    // --max-time's TERM
  Deadline lease_term_at{};  // the lease's TERM deadline, while the lease is live
  Deadline renew_at{};       // the lease's next renewal, while it is live
  Deadline group_poll_at{};  // the command has ended, the rest of its group is looked for then
  // The warning that becomes due if a renewal gets no answer (--warn-before
  // before the lease's TERM): a renewal returns by then, so that it is not
  // late; but it gets at least `renew_least` (one attempt) from now.
  Deadline lease_warn_at{};
  Duration renew_least{0};
  // Once warned, until the TERM: the next look for processes of the job
  // that catch the warning signal now (a handler installed late).
  Deadline warn_pass_at{};
  // The next look at what the run runs inside (CommandSpec::outer_ended).
  Deadline outer_poll_at{};
};

enum class JobAction { None, Kill, Warn, MaxTimeTerm, LeaseTerm, WarnPass, OuterPoll, Renew };

struct NextStep {
  JobAction action = JobAction::None;
  // None: wait for a signal until then (none: without limit). Renew: the
  // renewal must return by then: by the job's next deadline (KILL, the
  // warning, --max-time's TERM, the lease's TERM), and by the warning a
  // failing renewal would make due; a renewal not answered by then counts
  // as failing.
  Deadline until{};
};

// The first deadline that is due, in this order: KILL, the warning,
// --max-time's TERM, the lease's TERM, another pass of the warning, a look
// at what the run runs inside, a renewal; else how long to wait.
NextStep next_step(const JobDeadlines& d, Instant now);

}  // namespace looplock
