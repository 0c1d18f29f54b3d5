#include "os/clock.hpp"

#include <algorithm>

#include "os/sys.hpp"

namespace looplock {

MonotonicClock::time_point MonotonicClock::now() { return instant_ns(sys::monotonic_ns()); }

Instant later(Instant t, Duration d) {
  if (d > Duration::zero() && t > Instant::max() - d) return Instant::max();
  return t + d;
}

Deadline earliest(Deadline a, Deadline b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

void nap(Duration d) { sys::nap_ns(d.count()); }
void sleep_until(Instant t) { sys::sleep_until_ns(ns_of(t)); }

}  // namespace looplock
