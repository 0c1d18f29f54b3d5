#include "job/next_step.hpp"

#include <doctest/doctest.h>

#include <limits>

using looplock::JobAction;
using looplock::JobDeadlines;
using looplock::NextStep;

TEST_CASE("next_step: the first deadline that is due, in order, else how long to wait") {
  struct Row {
    const char* what;
    JobDeadlines d;
    long long now;
    JobAction action;
    long long until;
  };
  // kill, warn, max-time, lease TERM, renew, group poll
  const Row rows[] = {
      {"nothing at all: wait for a signal without limit", {}, 100, JobAction::None, 0},
      {"a --max-time in the future: wait until it", {0, 0, 500, 0, 0, 0}, 100, JobAction::None, 500},
      {"--max-time due", {0, 0, 500, 0, 0, 0}, 500, JobAction::MaxTimeTerm, 0},
      {"KILL due comes first", {400, 0, 300, 300, 300, 0}, 500, JobAction::Kill, 0},
      {"the warning before --max-time's TERM", {0, 300, 300, 0, 0, 0}, 300, JobAction::Warn, 0},
      {"the lease's TERM before a renewal", {0, 0, 0, 300, 200, 0}, 300, JobAction::LeaseTerm, 0},
      {"--max-time before the lease's TERM", {0, 0, 300, 300, 0, 0}, 300, JobAction::MaxTimeTerm, 0},
      {"a renewal returns by the earliest of TERM, KILL and --max-time",
       {900, 0, 700, 800, 100, 0},
       100,
       JobAction::Renew,
       700},
      {"a renewal without other deadlines returns by the lease's TERM",
       {0, 0, 0, 800, 100, 0},
       150,
       JobAction::Renew,
       800},
      {"a renewal returns by the --max-time warning too", {.warn_at = 400, .max_time_at = 700, .lease_term_at = 800,
                                                          .renew_at = 100}, 100, JobAction::Renew, 400},
      {"a renewal returns by the warning its failure would make due",
       {.lease_term_at = 800, .renew_at = 100, .lease_warn_at = 500, .renew_least_ns = 50}, 100, JobAction::Renew,
       500},
      {"... but gets one attempt when that warning is near (or past)",
       {.lease_term_at = 800, .renew_at = 100, .lease_warn_at = 90, .renew_least_ns = 50}, 100, JobAction::Renew,
       150},
      {"... and never past the lease's TERM",
       {.lease_term_at = 120, .renew_at = 100, .lease_warn_at = 90, .renew_least_ns = 50}, 100, JobAction::Renew,
       120},
      {"waiting: until the earliest deadline", {900, 850, 700, 800, 600, 0}, 100, JobAction::None, 600},
      {"waiting for the rest of the group: polled", {0, 0, 0, 0, 0, 120}, 100, JobAction::None, 120},
      {"a deadline of centuries is never due",
       {0, 0, std::numeric_limits<long long>::max(), 0, 0, 0},
       1'000'000,
       JobAction::None,
       std::numeric_limits<long long>::max()},
  };
  for (const Row& r : rows) {
    CAPTURE(r.what);
    const NextStep s = looplock::next_step(r.d, r.now);
    CHECK(s.action == r.action);
    CHECK(s.until == r.until);
  }
}

TEST_CASE("earliest and later: 0 is none, and deadlines saturate") {
  CHECK(looplock::earliest(0, 5) == 5);
  CHECK(looplock::earliest(5, 0) == 5);
  CHECK(looplock::earliest(3, 5) == 3);
  CHECK(looplock::earliest(0, 0) == 0);
  constexpr long long kMax = std::numeric_limits<long long>::max();
  CHECK(looplock::later(10, 5) == 15);
  CHECK(looplock::later(10, kMax) == kMax);
  CHECK(looplock::later(kMax - 1, 2) == kMax);
}
