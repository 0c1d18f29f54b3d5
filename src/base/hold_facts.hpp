// A hold across steps (--hold): what its holder record says of it, beside
// who holds the lock (records/holder.hpp writes it as "hold").
#pragma once

#include <string>

#include "os/ids.hpp"

namespace looplock {

struct HoldFacts {
  Pid tied_to = 0;            // --tied-to PID; 0: none
  std::string tied_start;     // that process's start time (os/process.hpp)
  std::string ends_at;        // when --max-time ends the hold (UTC, ISO 8601)
  std::string secret_sha256;  // of the secret LOOPLOCK_HOLD carries; the secret itself is never written
  long long max_time_ms = 0;  // --max-time: ends_at is this after the lock is taken (not written)
};

}  // namespace looplock
