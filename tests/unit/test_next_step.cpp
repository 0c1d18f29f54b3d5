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
  const Row rows[] = {
      {"nothing at all: wait for a signal without limit", {}, 100, JobAction::None, 0},
      {"a --max-time in the future: wait until it", {.max_time_at = 500}, 100, JobAction::None, 500},
      {"--max-time due", {.max_time_at = 500}, 500, JobAction::MaxTimeTerm, 0},
      {"KILL due comes first",
       {.kill_at = 400, .max_time_at = 300, .lease_term_at = 300, .renew_at = 300},
       500,
       JobAction::Kill,
       0},
      {"the warning before --max-time's TERM", {.warn_at = 300, .max_time_at = 300}, 300, JobAction::Warn, 0},
      {"the lease's TERM before a renewal", {.lease_term_at = 300, .renew_at = 200}, 300, JobAction::LeaseTerm, 0},
      {"--max-time before the lease's TERM",
       {.max_time_at = 300, .lease_term_at = 300},
       300,
       JobAction::MaxTimeTerm,
       0},
      {"a renewal returns by the earliest of TERM, KILL and --max-time",
       {.kill_at = 900, .max_time_at = 700, .lease_term_at = 800, .renew_at = 100},
       100,
       JobAction::Renew,
       700},
      {"a renewal without other deadlines returns by the lease's TERM",
       {.lease_term_at = 800, .renew_at = 100},
       150,
       JobAction::Renew,
       800},
      {"a renewal returns by the --max-time warning too",
       {.warn_at = 400, .max_time_at = 700, .lease_term_at = 800, .renew_at = 100},
       100,
       JobAction::Renew,
       400},
      {"a renewal returns by the warning its failure would make due",
       {.lease_term_at = 800, .renew_at = 100, .lease_warn_at = 500, .renew_least_ns = 50},
       100,
       JobAction::Renew,
       500},
      {"... but gets one attempt when that warning is near (or past)",
       {.lease_term_at = 800, .renew_at = 100, .lease_warn_at = 90, .renew_least_ns = 50},
       100,
       JobAction::Renew,
       150},
      {"... and never past the lease's TERM",
       {.lease_term_at = 120, .renew_at = 100, .lease_warn_at = 90, .renew_least_ns = 50},
       100,
       JobAction::Renew,
       120},
      {"waiting: until the earliest deadline",
       {.kill_at = 900, .warn_at = 850, .max_time_at = 700, .lease_term_at = 800, .renew_at = 600},
       100,
       JobAction::None,
       600},
      {"waiting for the rest of the group: polled", {.group_poll_at = 120}, 100, JobAction::None, 120},
      {"a deadline of centuries is never due",
       {.max_time_at = std::numeric_limits<long long>::max()},
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
