// The Lease interface: a lock's hold that lasts only while it is renewed
// (the cluster lock's etcd lease). The job loop (job_loop.hpp) renews it and
// ends the job before it can expire; a lock offers one through
// lock.hpp's Lock::lease(). Its timing for etcd is settings/lease_timing.hpp.
#pragma once

#include "os/interrupts.hpp"

namespace looplock {

// A lease the command runs under (the cluster lock, --etcd). The job loop
// renews it and ends the job before it can expire: TERM by term_by_ns(), KILL
// by kill_by_ns(), unless a renewal moved them on. All times CLOCK_MONOTONIC.
class Lease {
public:
  virtual ~Lease() = default;
  // When renew() is next due.
  virtual long long next_renewal_ns() const = 0;
  // One renewal; must return by `return_by_ns`, or soon after one of
  // `interrupt_on` happens. False once the lease is known to be gone (no
  // renewal can help).
  virtual bool renew(long long return_by_ns, const sys::Interrupts& interrupt_on) = 0;
  virtual long long term_by_ns() const = 0;
  virtual long long kill_by_ns() const = 0;
  // Whether the last renewal got no answer (term_by_ns() is not moving).
  virtual bool renewal_failing() const { return false; }
  // The least time a renewal needs (one attempt): a renewal is given that
  // much even when the warning it races is nearer.
  virtual long long least_renewal_ns() const { return 0; }
};

}  // namespace looplock
