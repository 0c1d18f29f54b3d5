// The cluster lock's lease timing, for a TTL of T seconds (all in ns): how
// often it is renewed, how long an attempt may take, and the deadlines by
// which the job must have been sent TERM and KILL (cluster.hpp says why;
// the man page's CLUSTER section has the table).
//   renewal: every T/12;
//   each attempt: T/10, at least 250 ms, at most 2 s;
//   margin: 200 ms + T/100;
//   kill-after by default: T/6, at most 5 s.
#pragma once

namespace looplock::lease_timing {

long long ttl_ns(int ttl_s);
long long margin_ns(int ttl_s);
long long renewal_interval_ns(int ttl_s);
long long attempt_ns(int ttl_s);
long long default_kill_after_ns(int ttl_s);
// The longest --kill-after that still leaves a quarter of the TTL, after the
// first renewal is due, to ride out an outage before TERM:
// T - margin - T/12 - T/4 (1.77 s at --ttl 3, 6.36 s at 10 s).
long long max_kill_after_ns(int ttl_s);

}  // namespace looplock::lease_timing
