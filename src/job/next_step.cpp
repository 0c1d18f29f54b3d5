#include "job/next_step.hpp"

#include <algorithm>
#include <limits>

namespace looplock {

long long earliest(long long a, long long b) { return a == 0 ? b : (b == 0 ? a : std::min(a, b)); }

long long later(long long t, long long d) {
  return d > std::numeric_limits<long long>::max() - t ? std::numeric_limits<long long>::max() : t + d;
}

NextStep next_step(const JobDeadlines& d, long long now) {
  auto due = [&](long long at) { return at != 0 && now >= at; };
  if (due(d.kill_at)) return {JobAction::Kill, 0};
  if (due(d.warn_at)) return {JobAction::Warn, 0};
  if (due(d.max_time_at)) return {JobAction::MaxTimeTerm, 0};
  if (due(d.lease_term_at)) return {JobAction::LeaseTerm, 0};
  if (due(d.warn_pass_at)) return {JobAction::WarnPass, 0};
  // While etcd does not answer, a renewal round takes until the next
  // deadline at the latest: it must not hold up any of them, nor the
  // warning its failure would make due.
  if (due(d.renew_at)) {
    long long by = earliest(earliest(d.lease_term_at, d.kill_at), earliest(d.max_time_at, d.warn_at));
    if (d.lease_warn_at != 0) by = earliest(by, std::max(d.lease_warn_at, now + d.renew_least_ns));
    return {JobAction::Renew, by};
  }
  long long until = earliest(d.kill_at, d.warn_at);
  until = earliest(until, d.max_time_at);
  until = earliest(until, d.lease_term_at);
  until = earliest(until, d.renew_at);
  until = earliest(until, d.group_poll_at);
  until = earliest(until, d.warn_pass_at);
  return {JobAction::None, until};
}

}  // namespace looplock
