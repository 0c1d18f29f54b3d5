#include "base/policy.hpp"

#include "base/duration.hpp"

namespace looplock {

std::optional<Policy> parse_policy(std::string_view name) {
  if (name == "mutation") return Policy::Mutation;
  if (name == "monitor") return Policy::Monitor;
  if (name == "single_flight") return Policy::SingleFlight;
  if (name == "blocking") return Policy::Blocking;
  if (name == "coalesce") return Policy::Coalesce;
  return std::nullopt;
}

std::string_view policy_name(Policy p) {
  switch (p) {
    case Policy::Mutation: return "mutation";
    case Policy::Monitor: return "monitor";
    case Policy::SingleFlight: return "single_flight";
    case Policy::Blocking: return "blocking";
    case Policy::Coalesce: return "coalesce";
  }
  return "mutation";
}

Duration default_timeout(Policy policy) {
  switch (policy) {
    case Policy::Mutation: return std::chrono::seconds(5);
    case Policy::Monitor: return std::chrono::seconds(1);
    default: return Duration::zero();
  }
}

bool policy_takes_timeout(Policy policy) {
  return policy == Policy::Mutation || policy == Policy::Monitor || policy == Policy::Coalesce;
}

WaitPlan wait_plan(Policy policy, std::optional<Duration> timeout) {
  switch (policy) {
    case Policy::SingleFlight: return {WaitPlan::Kind::NoWait, Duration::zero()};
    case Policy::Blocking: return {WaitPlan::Kind::Unbounded, Duration::zero()};
    case Policy::Coalesce:
      if (!timeout || timeout == kForever) return {WaitPlan::Kind::Unbounded, Duration::zero()};
      return {WaitPlan::Kind::Bounded, *timeout};
    default:
      // -w inf: no deadline at all.
      if (timeout == kForever) return {WaitPlan::Kind::Unbounded, Duration::zero()};
      return {WaitPlan::Kind::Bounded, timeout.value_or(default_timeout(policy))};
  }
}

std::string operator_action(Policy policy, const std::string& who, bool many) {
  std::string common = "inspect " + who + " (looplock --inspect DIR); confirm " + (many ? "they are" : "it is") +
                       " still running and actually stalled before terminating " + (many ? "them" : "it") +
                       "; never delete the lock file";
  switch (policy) {
    case Policy::Monitor: return common + "; the monitor retries at its next scheduled poll, not in a tight loop";
    case Policy::Mutation: return common + "; retry the mutation by hand once the holder has exited";
    case Policy::Coalesce:
      return common + "; the ticks this run absorbed (coalesced) did not run either: the next tick runs them";
    default: return common + "; retry once the holder has exited";
  }
}

}  // namespace looplock
