// The cluster lock's lease timing, for a TTL of T seconds: how
// often it is renewed, how long an attempt may take, and the deadlines by
// which the job must have been sent TERM and KILL (cluster.hpp says why;
// looplock-cluster(7) has the table).
//   renewal, holding: every clamp(T - kill-after - margin - E, T/12, T/3),
//     E = max(2.5 s, T/4), the outage it is to ride out (a leader election,
//     or a quarter of the TTL, the room --kill-after must leave): no more
//     often than that needs, at least as often as etcd's own client (T/3),
//     and never more often than T/12;
//   renewal, waiting: every T/3 (a lost place in the queue is only a wait);
//   each attempt: T/10, at least 250 ms, at most 2 s;
//   margin: 200 ms + T/100;
//   kill-after by default: T/6, at most 5 s.
#pragma once

#include "os/clock.hpp"

namespace looplock::lease_timing {

// E's least: the outage a holder's lease rides out when the TTL leaves room
// for it (a quarter of the TTL when that is longer).
inline constexpr Duration kRideOut = std::chrono::milliseconds(2500);

Duration ttl(int ttl_s);
Duration margin(int ttl_s);
// How often a holder renews with this kill-after.
Duration holder_renewal(int ttl_s, Duration kill_after);
// How often a waiter renews.
Duration waiter_renewal(int ttl_s);
// The most often a holder renews: T/12.
Duration min_renewal(int ttl_s);
// The longest outage a holder's lease rides out (one that begins just
// before a renewal is due): T - kill-after - margin - its renewal interval.
Duration outage_ridden(int ttl_s, Duration kill_after);
Duration attempt(int ttl_s);
Duration default_kill_after(int ttl_s);
// The longest --kill-after that still leaves a quarter of the TTL, after the
// first renewal is due at the most frequent, to ride out an outage before
// TERM: T - margin - T/12 - T/4 (1.77 s at --ttl 3, 6.36 s at 10 s).
Duration max_kill_after(int ttl_s);

}  // namespace looplock::lease_timing
