#include "run/run.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>

using looplock::Conclusion;
using looplock::Exit;
using looplock::JobEnd;
using looplock::RunOutcome;

namespace {

JobEnd exited(int status) {
  JobEnd j;
  j.status = status << 8;  // a wait status: exited with `status`
  return j;
}

JobEnd killed_by(int sig) {
  JobEnd j;
  j.status = sig;
  return j;
}

}  // namespace

TEST_CASE("the conclusion of a job that ran: the command's own status, or looplock's, in one order") {
  struct Row {
    const char* what;
    JobEnd job;
    bool lease_lost;
    bool intact;
    Exit::Kind kind;
    int value;
    RunOutcome outcome;
  };
  JobEnd max_time = exited(143);
  max_time.ended_by = JobEnd::EndedBy::MaxTime;
  const Row rows[] = {
      {"success", exited(0), false, true, Exit::Kind::LikeWaitStatus, 0, RunOutcome::Success},
      {"failure", exited(3), false, true, Exit::Kind::LikeWaitStatus, 3 << 8, RunOutcome::Failure},
      {"signal", killed_by(SIGTERM), false, true, Exit::Kind::LikeWaitStatus, SIGTERM, RunOutcome::Signaled},
      {"vanished under a success", exited(0), false, false, Exit::Kind::ExitStatus, 74, RunOutcome::Error},
      {"vanished under a failure: its status wins", exited(3), false, false, Exit::Kind::LikeWaitStatus, 3 << 8,
       RunOutcome::Failure},
      {"max-time", max_time, false, true, Exit::Kind::ExitStatus, 124, RunOutcome::MaxTime},
      {"max-time beats vanished", max_time, false, false, Exit::Kind::ExitStatus, 124, RunOutcome::MaxTime},
      {"lease lost beats max-time", max_time, true, false, Exit::Kind::ExitStatus, 76, RunOutcome::LeaseLost},
      {"lease lost", exited(0), true, true, Exit::Kind::ExitStatus, 76, RunOutcome::LeaseLost},
  };
  for (const Row& r : rows) {
    CAPTURE(r.what);
    const Conclusion c = looplock::conclude(r.job, r.lease_lost, r.intact);
    CHECK(c.exit.kind == r.kind);
    CHECK(c.exit.value == r.value);
    CHECK(c.outcome == r.outcome);
  }
}
