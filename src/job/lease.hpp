// The Lease interface: a lock's hold that lasts only while it is renewed
// (the cluster lock's etcd lease). The job loop (job_loop.hpp) renews it and
// ends the job before it can expire; a lock offers one through
// lock.hpp's Lock::lease(). Its timing for etcd is settings/lease_timing.hpp.
#pragma once

#include "os/clock.hpp"
#include "os/interrupts.hpp"

namespace looplock {

// A lease the command runs under (the cluster lock, --etcd). The job loop
// renews it and ends the job before it can expire: TERM by term_by(), KILL
// by kill_by(), unless a renewal moved them on.
class Lease {
public:
  virtual ~Lease() = default;
  // When renew() is next due.
  virtual Instant next_renewal() const = 0;
  // One renewal; must return by `return_by` (none: by term_by()), or soon
  // after one of `interrupt_on` happens. False once the lease is known to be gone (no
  // renewal can help).
  virtual bool renew(Deadline return_by, const sys::Interrupts& interrupt_on) = 0;
  virtual Instant term_by() const = 0;
  virtual Instant kill_by() const = 0;
  // Whether the last renewal got no answer (term_by() is not moving).
  virtual bool renewal_failing() const { return false; }
  // The least time a renewal needs (one attempt): a renewal is given that
  // much even when the warning it races is nearer.
  virtual Duration least_renewal() const { return Duration::zero(); }
};

}  // namespace looplock
