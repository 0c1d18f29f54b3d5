// What several unit tests start from, on every system (testutil.hpp includes
// it; a test that runs on Windows too includes it alone).
#pragma once

#include <optional>
#include <string>

#include "records/holder.hpp"

namespace testutil {

// The holder record the record, incident and inspect tests start from.
inline looplock::HolderRecord sample_record(std::optional<std::string> released = std::nullopt) {
  looplock::HolderRecord r;
  r.lock_id = "0123456789abcdef";
  r.pid = 1234;
  r.pid_start = "987654";
  r.agent_id = "cron";
  r.operation = "status.py";
  r.policy = "mutation";
  r.acquired_at = "2026-11-30T17:00:00.123Z";
  r.released_at = std::move(released);
  return r;
}

}  // namespace testutil
