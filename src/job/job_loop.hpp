// The job loop: the command runs as a job that the operating system starts
// (os/job_control.hpp), and a loop, as tini's and dumb-init's, reaps what
// ended, carries out what next_step() says is due (--kill-after's KILL,
// --max-time's TERM, --warn-before's warning, a lease's renewal, its TERM),
// and else waits for a signal and passes it on to the job.
#pragma once

#include "base/log.hpp"
#include "job/job.hpp"
#include "os/job_control.hpp"

namespace looplock {

// Starts the command under `control` and supervises it until it has ended
// (and, when looplock ended it, until its whole job has). Throws Fatal 71 if
// it cannot be started safely or looplock loses track of it, 126/127 if the
// command cannot be executed.
JobEnd run_command(const CommandSpec& spec, sys::JobControl& control, const Logger& log);

// Replaces looplock with the command (-F). Returns only by throwing Fatal.
[[noreturn]] void exec_command(const CommandSpec& spec, sys::JobControl& control);

// The status for an exec(2) errno: 127 when not found, else 126.
int exec_failure_status(int err);

}  // namespace looplock
