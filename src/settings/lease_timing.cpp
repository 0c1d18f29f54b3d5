#include "settings/lease_timing.hpp"

#include "base/duration.hpp"

#include <algorithm>

namespace looplock::lease_timing {

namespace {
constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1'000'000'000LL;
}  // namespace

long long ttl_ns(int ttl_s) { return static_cast<long long>(ttl_s) * kSec; }
long long margin_ns(int ttl_s) { return 200 * kMs + ttl_ns(ttl_s) / 100; }
long long min_renewal_ns(int ttl_s) { return ttl_ns(ttl_s) / 12; }
long long waiter_renewal_ns(int ttl_s) { return ttl_ns(ttl_s) / 3; }
long long holder_renewal_ns(int ttl_s, long long kill_after_ns) {
  const long long ride_out = std::max(kRideOutNs, ttl_ns(ttl_s) / 4);
  const long long room = ttl_ns(ttl_s) - kill_after_ns - margin_ns(ttl_s) - ride_out;
  return std::clamp(room, min_renewal_ns(ttl_s), waiter_renewal_ns(ttl_s));
}
long long outage_ridden_ns(int ttl_s, long long kill_after_ns) {
  return ttl_ns(ttl_s) - kill_after_ns - margin_ns(ttl_s) - holder_renewal_ns(ttl_s, kill_after_ns);
}
long long attempt_ns(int ttl_s) { return std::clamp(ttl_ns(ttl_s) / 10, 250 * kMs, 2 * kSec); }
long long default_kill_after_ns(int ttl_s) { return std::min(5 * kSec, ttl_ns(ttl_s) / 6); }
long long max_kill_after_ns(int ttl_s) {
  return ttl_ns(ttl_s) - margin_ns(ttl_s) - min_renewal_ns(ttl_s) - ttl_ns(ttl_s) / 4;
}

}  // namespace looplock::lease_timing
