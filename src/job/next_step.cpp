#include "job/next_step.hpp"

#include <algorithm>

namespace looplock {

NextStep next_step(const JobDeadlines& d, Instant now) {
  auto due = [&](Deadline at) { return at && now >= *at; };
  if (due(d.kill_at)) return {JobAction::Kill, std::nullopt};
  if (due(d.warn_at)) return {JobAction::Warn, std::nullopt};
  if (due(d.max_time_at)) return {JobAction::MaxTimeTerm, std::nullopt};
  if (due(d.lease_term_at)) return {JobAction::LeaseTerm, std::nullopt};
  if (due(d.warn_pass_at)) return {JobAction::WarnPass, std::nullopt};
  if (due(d.outer_poll_at)) return {JobAction::OuterPoll, std::nullopt};
  // While etcd does not answer, a renewal round takes until the next
  // deadline at the latest: it must not hold up any of them, nor the
  // warning its failure would make due.
  if (due(d.renew_at)) {
    Deadline by = earliest(earliest(d.lease_term_at, d.kill_at), earliest(d.max_time_at, d.warn_at));
    if (d.lease_warn_at) by = earliest(by, std::max(*d.lease_warn_at, later(now, d.renew_least)));
    return {JobAction::Renew, by};
  }
  Deadline until = earliest(d.kill_at, d.warn_at);
  until = earliest(until, d.max_time_at);
  until = earliest(until, d.lease_term_at);
  until = earliest(until, d.renew_at);
  until = earliest(until, d.group_poll_at);
  until = earliest(until, d.warn_pass_at);
  until = earliest(until, d.outer_poll_at);
  return {JobAction::None, until};
}

}  // namespace looplock
