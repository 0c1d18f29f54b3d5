#include "lease.hpp"

#include <algorithm>

namespace looplock::lease_timing {

namespace {
constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1000 * kMs;
}  // namespace

long long ttl_ns(int ttl_s) { return static_cast<long long>(ttl_s) * kSec; }
long long margin_ns(int ttl_s) { return 200 * kMs + ttl_ns(ttl_s) / 100; }
long long renewal_interval_ns(int ttl_s) { return ttl_ns(ttl_s) / 12; }
long long attempt_ns(int ttl_s) { return std::clamp(ttl_ns(ttl_s) / 10, 250 * kMs, 2 * kSec); }
long long default_kill_after_ns(int ttl_s) { return std::min(5 * kSec, ttl_ns(ttl_s) / 6); }
long long max_kill_after_ns(int ttl_s) {
  return ttl_ns(ttl_s) - margin_ns(ttl_s) - renewal_interval_ns(ttl_s) - ttl_ns(ttl_s) / 4;
}

}  // namespace looplock::lease_timing
