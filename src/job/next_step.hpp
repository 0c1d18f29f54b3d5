// What the job loop (job_loop.cpp) does next: a pure function of the job's
// deadlines and the time, so that the deadline rules looplock adds to a
// command (--kill-after, --max-time, the lease's TERM and its renewals, the
// warning before them) are tested without processes. All times are
// CLOCK_MONOTONIC ns; 0 means "none".
#pragma once

namespace looplock {

struct JobDeadlines {
  long long kill_at = 0;        // KILL the job's group (--kill-after after a TERM, or the lease's)
  long long warn_at = 0;        // send the job the warning signal (--warn-before), once
  long long max_time_at = 0;    // --max-time's TERM
  long long lease_term_at = 0;  // the lease's TERM deadline, while the lease is live
  long long renew_at = 0;       // the lease's next renewal, while it is live
  long long group_poll_at = 0;  // the command has ended, the rest of its group is looked for then
  // The warning that becomes due if a renewal gets no answer (--warn-before
  // before the lease's TERM): a renewal returns by then, so that it is not
  // late; but it gets at least `renew_least_ns` (one attempt) from now.
  long long lease_warn_at = 0;
  long long renew_least_ns = 0;
  // Once warned, until the TERM: the next look for processes of the job
  // that catch the warning signal now (a handler installed late).
  long long warn_pass_at = 0;
};

enum class JobAction { None, Kill, Warn, MaxTimeTerm, LeaseTerm, WarnPass, Renew };

struct NextStep {
  JobAction action = JobAction::None;
  // None: wait for a signal until then (0: without limit). Renew: the
  // renewal must return by then: by the job's next deadline (KILL, the
  // warning, --max-time's TERM, the lease's TERM), and by the warning a
  // failing renewal would make due; a renewal not answered by then counts
  // as failing.
  long long until = 0;
};

// The first deadline that is due, in this order: KILL, the warning,
// --max-time's TERM, the lease's TERM, another pass of the warning, a
// renewal; else how long to wait.
NextStep next_step(const JobDeadlines& d, long long now);

// The earlier of two deadlines (0: none).
long long earliest(long long a, long long b);
// t + d for a deadline, saturating: a duration of centuries (--max-time
// 100000d) is a deadline that never comes, not an overflow.
long long later(long long t, long long d);

}  // namespace looplock
