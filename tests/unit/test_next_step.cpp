#include "job/next_step.hpp"

#include <doctest/doctest.h>

#include <limits>

using looplock::Duration;
using looplock::Instant;
using looplock::JobAction;
using looplock::JobDeadlines;
using looplock::NextStep;

namespace {
// The time `n` ns on the monotonic clock; rows say 0 for "none" and kNever
// for a deadline that never comes.
Instant at(long long n) { return looplock::instant_ns(n); }
constexpr long long kNever = -1;
}  // namespace

TEST_CASE("next_step: the first deadline that is due, in order, else how long to wait") {
  struct Row {
    const char* what;
    JobDeadlines d;
    long long now;
    JobAction action;
    long long until;
  };
  const Row rows[] = {
      {.what = "nothing at all: wait for a signal without limit",
       .d = {},
       .now = 100,
       .action = JobAction::None,
       .until = 0},
      {.what = "a --max-time in the future: wait until it",
       .d = {.max_time_at = at(500)},
       .now = 100,
       .action = JobAction::None,
       .until = 500},
      {.what = "--max-time due",
       .d = {.max_time_at = at(500)},
       .now = 500,
       .action = JobAction::MaxTimeTerm,
       .until = 0},
      {.what = "KILL due comes first",
       .d = {.kill_at = at(400), .max_time_at = at(300), .lease_term_at = at(300), .renew_at = at(300)},
       .now = 500,
       .action = JobAction::Kill,
       .until = 0},
      {.what = "the warning before --max-time's TERM",
       .d = {.warn_at = at(300), .max_time_at = at(300)},
       .now = 300,
       .action = JobAction::Warn,
       .until = 0},
      {.what = "the lease's TERM before a renewal",
       .d = {.lease_term_at = at(300), .renew_at = at(200)},
       .now = 300,
       .action = JobAction::LeaseTerm,
       .until = 0},
      {.what = "--max-time before the lease's TERM",
       .d = {.max_time_at = at(300), .lease_term_at = at(300)},
       .now = 300,
       .action = JobAction::MaxTimeTerm,
       .until = 0},
      {.what = "a renewal returns by the earliest of TERM, KILL and --max-time",
       .d = {.kill_at = at(900), .max_time_at = at(700), .lease_term_at = at(800), .renew_at = at(100)},
       .now = 100,
       .action = JobAction::Renew,
       .until = 700},
      {.what = "a renewal without other deadlines returns by the lease's TERM",
       .d = {.lease_term_at = at(800), .renew_at = at(100)},
       .now = 150,
       .action = JobAction::Renew,
       .until = 800},
      {.what = "a renewal returns by the --max-time warning too",
       .d = {.warn_at = at(400), .max_time_at = at(700), .lease_term_at = at(800), .renew_at = at(100)},
       .now = 100,
       .action = JobAction::Renew,
       .until = 400},
      {.what = "a renewal returns by the warning its failure would make due",
       .d = {.lease_term_at = at(800), .renew_at = at(100), .lease_warn_at = at(500), .renew_least = Duration(50)},
       .now = 100,
       .action = JobAction::Renew,
       .until = 500},
      {.what = "... but gets one attempt when that warning is near (or past)",
       .d = {.lease_term_at = at(800), .renew_at = at(100), .lease_warn_at = at(90), .renew_least = Duration(50)},
       .now = 100,
       .action = JobAction::Renew,
       .until = 150},
      {.what = "... and never past the lease's TERM",
       .d = {.lease_term_at = at(120), .renew_at = at(100), .lease_warn_at = at(90), .renew_least = Duration(50)},
       .now = 100,
       .action = JobAction::Renew,
       .until = 120},
      {.what = "waiting: until the earliest deadline",
       .d = {.kill_at = at(900),
             .warn_at = at(850),
             .max_time_at = at(700),
             .lease_term_at = at(800),
             .renew_at = at(600)},
       .now = 100,
       .action = JobAction::None,
       .until = 600},
      {.what = "waiting for the rest of the group: polled",
       .d = {.group_poll_at = at(120)},
       .now = 100,
       .action = JobAction::None,
       .until = 120},
      {.what = "a look at the hold is due after the warning's pass and before a renewal",
       .d = {.renew_at = at(100), .outer_poll_at = at(100)},
       .now = 100,
       .action = JobAction::OuterPoll,
       .until = 0},
      {.what = "--max-time's TERM comes before a look at the hold",
       .d = {.max_time_at = at(100), .outer_poll_at = at(100)},
       .now = 100,
       .action = JobAction::MaxTimeTerm,
       .until = 0},
      {.what = "the next look at the hold bounds the wait",
       .d = {.renew_at = at(300), .outer_poll_at = at(200)},
       .now = 100,
       .action = JobAction::None,
       .until = 200},
      {.what = "a deadline of centuries is never due",
       .d = {.max_time_at = Instant::max()},
       .now = 1'000'000,
       .action = JobAction::None,
       .until = kNever},
  };
  for (const Row& r : rows) {
    CAPTURE(r.what);
    const NextStep s = looplock::next_step(r.d, at(r.now));
    CHECK(s.action == r.action);
    if (r.until == 0) {
      CHECK_FALSE(s.until);  // none: without limit
    } else {
      REQUIRE(s.until);
      CHECK(*s.until == (r.until == kNever ? Instant::max() : at(r.until)));
    }
  }
}

TEST_CASE("earliest and later: an empty deadline is none, and deadlines saturate") {
  CHECK(looplock::earliest(std::nullopt, at(5)) == at(5));
  CHECK(looplock::earliest(at(5), std::nullopt) == at(5));
  CHECK(looplock::earliest(at(3), at(5)) == at(3));
  CHECK_FALSE(looplock::earliest(std::nullopt, std::nullopt));
  CHECK(looplock::later(at(10), Duration(5)) == at(15));
  CHECK(looplock::later(at(10), Duration::max()) == Instant::max());
  CHECK(looplock::later(Instant::max() - Duration(1), Duration(2)) == Instant::max());
  CHECK(looplock::later(at(10), Duration(-5)) == at(5));
}
