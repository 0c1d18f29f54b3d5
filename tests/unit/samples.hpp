// What several unit tests start from, on every system (testutil.hpp includes
// it; a test that runs on Windows too includes it alone).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "records/holder.hpp"
#include "records/run_entry.hpp"

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

// A moment in 2026, in ms since the epoch, and a run of `operation` then, as
// the run ledger tests start from.
inline constexpr long long kT = 1'796'000'000'000LL;
inline looplock::RunEntry run_entry(std::string operation, long long started_ms,
                                    std::optional<long long> ended_ms = std::nullopt) {
  looplock::RunEntry e;
  e.operation = std::move(operation);
  e.host = "h1";
  e.pid = 4242;
  e.agent = "cron";
  e.started_ms = started_ms;
  e.ended_ms = ended_ms;
  if (ended_ms) e.exit_status = 0;
  return e;
}

}  // namespace testutil
