#include "base/policy.hpp"

#include <doctest/doctest.h>

#include <string>

#include "base/duration.hpp"

using looplock::Policy;
using looplock::WaitPlan;

namespace {
bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
}  // namespace

TEST_CASE("parse_policy and policy_name") {
  for (Policy p : {Policy::Mutation, Policy::Monitor, Policy::SingleFlight, Policy::Blocking, Policy::Coalesce}) {
    CHECK(looplock::parse_policy(looplock::policy_name(p)) == p);
  }
  CHECK(looplock::policy_name(Policy::Coalesce) == "coalesce");
  CHECK(looplock::policy_name(Policy::Mutation) == "mutation");
  CHECK(looplock::policy_name(Policy::Monitor) == "monitor");
  CHECK(looplock::policy_name(Policy::SingleFlight) == "single_flight");
  CHECK(looplock::policy_name(Policy::Blocking) == "blocking");
  for (const char* bad : {"", "Mutation", "single-flight", "singleflight", "block", " mutation", "mutation "}) {
    std::string shown = bad;
    CAPTURE(shown);
    CHECK_FALSE(looplock::parse_policy(bad));
  }
}

TEST_CASE("wait_plan for each policy") {
  using namespace std::chrono_literals;
  WaitPlan p = looplock::wait_plan(Policy::Mutation, std::nullopt);
  CHECK(p.kind == WaitPlan::Kind::Bounded);
  CHECK(p.timeout == 5s);
  p = looplock::wait_plan(Policy::Monitor, std::nullopt);
  CHECK(p.kind == WaitPlan::Kind::Bounded);
  CHECK(p.timeout == 1s);
  p = looplock::wait_plan(Policy::SingleFlight, std::nullopt);
  CHECK(p.kind == WaitPlan::Kind::NoWait);
  p = looplock::wait_plan(Policy::Blocking, std::nullopt);
  CHECK(p.kind == WaitPlan::Kind::Unbounded);

  // -w replaces the deadline of mutation and monitor; 0 means one attempt.
  p = looplock::wait_plan(Policy::Mutation, 0s);
  CHECK(p.kind == WaitPlan::Kind::Bounded);
  CHECK(p.timeout == 0s);
  p = looplock::wait_plan(Policy::Monitor, 30s + 1ns);
  CHECK(p.kind == WaitPlan::Kind::Bounded);
  CHECK(p.timeout == 30s + 1ns);
  // -w inf, or beyond some 292 years (what the grammar saturates to): no deadline at all.
  CHECK(looplock::wait_plan(Policy::Mutation, looplock::kForever).kind == WaitPlan::Kind::Unbounded);
  CHECK(looplock::wait_plan(Policy::Mutation, *looplock::parse_duration("1e30")).kind == WaitPlan::Kind::Unbounded);
  CHECK(looplock::wait_plan(Policy::Mutation, looplock::kForever - 1ns).kind == WaitPlan::Kind::Bounded);

  CHECK(looplock::default_timeout(Policy::Mutation) == 5s);
  CHECK(looplock::default_timeout(Policy::Monitor) == 1s);
  CHECK(looplock::policy_takes_timeout(Policy::Mutation));
  CHECK(looplock::policy_takes_timeout(Policy::Monitor));
  CHECK_FALSE(looplock::policy_takes_timeout(Policy::SingleFlight));
  CHECK_FALSE(looplock::policy_takes_timeout(Policy::Blocking));

  // coalesce: its one waiter waits without limit, unless -w bounds it.
  CHECK(looplock::policy_takes_timeout(Policy::Coalesce));
  CHECK(looplock::wait_plan(Policy::Coalesce, std::nullopt).kind == WaitPlan::Kind::Unbounded);
  CHECK(looplock::wait_plan(Policy::Coalesce, looplock::kForever).kind == WaitPlan::Kind::Unbounded);
  p = looplock::wait_plan(Policy::Coalesce, 2s);
  CHECK(p.kind == WaitPlan::Kind::Bounded);
  CHECK(p.timeout == 2s);
  CHECK(looplock::wait_plan(Policy::Coalesce, 0s).kind == WaitPlan::Kind::Bounded);
}

TEST_CASE("operator_action tells what to do, per policy") {
  for (Policy p : {Policy::Mutation, Policy::Monitor, Policy::SingleFlight, Policy::Blocking, Policy::Coalesce}) {
    std::string a = looplock::operator_action(p);
    CAPTURE(a);
    CHECK(contains(a, "inspect the holder (looplock --inspect DIR); confirm it is still running"));
    CHECK(contains(a, "looplock --inspect"));
    CHECK(contains(a, "stalled before terminating"));
    CHECK(contains(a, "never delete the lock file"));
    CHECK(a.find('/') == std::string::npos);  // no path in incident rows
  }
  std::string monitor = looplock::operator_action(Policy::Monitor);
  CHECK(contains(monitor, "next scheduled poll"));
  CHECK(contains(monitor, "not in a tight loop"));
  std::string mutation = looplock::operator_action(Policy::Mutation);
  CHECK(contains(mutation, "retry"));
  CHECK_FALSE(contains(mutation, "poll"));
  CHECK(mutation != monitor);
  // Naming the holders the kernel shows, in agreement with their number.
  CHECK(looplock::operator_action(Policy::Mutation, "pid 12")
            .starts_with(
                "inspect pid 12 (looplock --inspect DIR); confirm it is still running and actually stalled before "
                "terminating it;"));
  CHECK(looplock::operator_action(Policy::Mutation, "pids 12, 13", true)
            .starts_with("inspect pids 12, 13 (looplock --inspect DIR); confirm they are still running and actually "
                         "stalled before "
                         "terminating them;"));
}
