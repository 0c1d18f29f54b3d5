#include "settings/lease_timing.hpp"

#include <algorithm>

namespace looplock::lease_timing {

using std::chrono::milliseconds;
using std::chrono::seconds;

Duration ttl(int ttl_s) { return seconds(ttl_s); }
Duration margin(int ttl_s) { return milliseconds(200) + ttl(ttl_s) / 100; }
Duration min_renewal(int ttl_s) { return ttl(ttl_s) / 12; }
Duration waiter_renewal(int ttl_s) { return ttl(ttl_s) / 3; }
Duration holder_renewal(int ttl_s, Duration kill_after) {
  const Duration ride_out = std::max(kRideOut, ttl(ttl_s) / 4);
  const Duration room = ttl(ttl_s) - kill_after - margin(ttl_s) - ride_out;
  return std::clamp(room, min_renewal(ttl_s), waiter_renewal(ttl_s));
}
Duration outage_ridden(int ttl_s, Duration kill_after) {
  return ttl(ttl_s) - kill_after - margin(ttl_s) - holder_renewal(ttl_s, kill_after);
}
Duration attempt(int ttl_s) { return std::clamp<Duration>(ttl(ttl_s) / 10, milliseconds(250), seconds(2)); }
Duration default_kill_after(int ttl_s) { return std::min<Duration>(seconds(5), ttl(ttl_s) / 6); }
Duration max_kill_after(int ttl_s) { return ttl(ttl_s) - margin(ttl_s) - min_renewal(ttl_s) - ttl(ttl_s) / 4; }

}  // namespace looplock::lease_timing
