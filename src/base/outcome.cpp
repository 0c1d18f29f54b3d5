#include "base/outcome.hpp"

namespace looplock {

std::string_view outcome_name(RunOutcome o) {
  switch (o) {
    case RunOutcome::Success: return "success";
    case RunOutcome::Failure: return "failure";
    case RunOutcome::Signaled: return "signaled";
    case RunOutcome::Skipped: return "skipped";
    case RunOutcome::Timeout: return "timeout";
    case RunOutcome::LeaseLost: return "lease_lost";
    case RunOutcome::MaxTime: return "max_time";
    case RunOutcome::Error: return "error";
  }
  return "error";
}

}  // namespace looplock
