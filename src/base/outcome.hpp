// How a run ended, as its conclusion (run/run.hpp) and the metrics
// (records/metrics.hpp, looplock_runs_total{outcome=...}) count it.
#pragma once

#include <string_view>

namespace looplock {

enum class RunOutcome { Success, Failure, Signaled, Skipped, Timeout, LeaseLost, MaxTime, Error };
std::string_view outcome_name(RunOutcome o);
inline constexpr RunOutcome kAllOutcomes[] = {RunOutcome::Success, RunOutcome::Failure, RunOutcome::Signaled,
                                              RunOutcome::Skipped, RunOutcome::Timeout, RunOutcome::LeaseLost,
                                              RunOutcome::MaxTime, RunOutcome::Error};

}  // namespace looplock
