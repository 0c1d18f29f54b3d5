// The acquisition policies (looplock(1), POLICIES): how long to wait and what a conflict
// means. Pure data and pure functions, no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "os/clock.hpp"

namespace looplock {

enum class Policy { Mutation, Monitor, SingleFlight, Blocking, Coalesce };

std::optional<Policy> parse_policy(std::string_view name);
std::string_view policy_name(Policy p);

// How an attempt to take a lock ended, for every kind of lock: taken, held
// by another (a policy that does not wait), held past the deadline, or (-p
// coalesce) held while another run of the same operation already waits for
// it, which this run's tick joins instead of waiting too.
enum class Acquisition { Acquired, Busy, TimedOut, Coalesced };

// How the lock is waited for.
struct WaitPlan {
  enum class Kind {
    Bounded,    // retry until `timeout` has passed (0: one attempt)
    NoWait,     // one attempt; a conflict is an ordinary skip
    Unbounded,  // wait as long as it takes
  };
  Kind kind = Kind::Bounded;
  Duration timeout{0};
};

// The plan for `policy`, with `timeout` (from -w) replacing the default
// deadline of mutation and monitor. A timeout with single_flight or blocking
// is rejected earlier, by option validation.
// A timeout of kForever (base/duration.hpp: -w inf, or beyond some 292
// years) waits without limit.
WaitPlan wait_plan(Policy policy, std::optional<Duration> timeout);

// Default timeout of a bounded policy.
Duration default_timeout(Policy policy);

// Whether -w/--timeout is allowed with this policy (mutation, monitor, and
// coalesce, whose one waiter waits without limit unless -w bounds it).
bool policy_takes_timeout(Policy policy);

// What the operator should do after a timeout under this policy (incident
// rows): inspect `who` ("pid 12", "pids 12, 13", or "the holder" when the
// kernel does not name it; `many` for more than one), confirm it is stalled
// before terminating it, retry as the policy says.
std::string operator_action(Policy policy, const std::string& who = "the holder", bool many = false);

}  // namespace looplock
