#include "run.hpp"

#include <sys/wait.h>

#include "error.hpp"
#include "etcd_lock.hpp"
#include "exit_codes.hpp"
#include "local_lock.hpp"
#include "spawn.hpp"
#include "sys.hpp"

namespace looplock {

namespace {

Exit exit_status(int status) { return {Exit::Kind::ExitStatus, status}; }

RunOutcome outcome_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) return RunOutcome::Signaled;
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 ? RunOutcome::Success : RunOutcome::Failure;
}

}  // namespace

Conclusion conclude(const JobEnd& job, bool lease_lost, bool intact) {
  if (lease_lost) return {exit_status(exit_code::kLeaseLost), RunOutcome::LeaseLost};
  if (job.ended_by == JobEnd::EndedBy::MaxTime) return {exit_status(exit_code::kMaxTime), RunOutcome::MaxTime};
  const RunOutcome outcome = outcome_of(job.status);
  if (!intact && outcome == RunOutcome::Success) return {exit_status(exit_code::kVanished), RunOutcome::Error};
  return {{Exit::Kind::LikeWaitStatus, job.status}, outcome};
}

Run::Run(const Options& options, const Context& context, const Logger& log, RunFacts& facts)
    : o_(options), ctx_(context), log_(log), facts_(facts), reporter_(options, context.pid, log) {}

Exit Run::run() {
  open();
  for (auto& lock : locks_) {
    lock->prepare(spec_);
    if (auto conflict = acquire(*lock)) return finish(*conflict);
    lock->export_to(spec_);
    if (Lease* lease = lock->lease()) spec_.lease = lease;
  }
  const JobEnd job = run_job();
  return finish(release(job));
}

// DIR, what the lock is called, and the stack of locks to take: inside an
// outer looplock that holds this lock, only that one (it is held already);
// else the cluster lock first and the local one second, always in that
// order, so that two hosts never wait for each other crosswise.
void Run::open() {
  inherited_ = take_signal_control();
  dir_ = open_lock_dir(o_.dir);
  if (auto fs = network_file_system(dir_.fd.get())) {
    log_.warn("network_file_system", o_.dir + " is on a network file system (" + *fs +
                                         "): flock(2) there may not exclude processes on other hosts; looplock "
                                         "supports local file systems only");
  }
  target_ = target_of(dir_.fd.get(), o_.dir);
  facts_.lock_id = target_.lock_id;
  facts_.loop = target_.loop;
  log_.set_lock_id(target_.lock_id);
  reporter_.set_target(dir_.fd.get(), target_.lock_id);
  plan_ = wait_plan(o_.policy, o_.timeout_ns);

  spec_.argv = o_.command;
  spec_.env = ctx_.env;
  spec_.kill_after_ns = o_.signal_kill_after_ns;
  spec_.max_time_ns = o_.max_time_ns;
  spec_.max_time_kill_after_ns = o_.max_time_kill_after_ns;

  struct stat lock_file {};
  if (auto outer = outer_holder(o_, ctx_.env, dir_, ctx_.pid, lock_file)) {
    locks_.push_back(std::make_unique<InheritedLock>(o_, log_, *outer, lock_file));
    return;
  }
  if (!o_.etcd.empty()) {
    locks_.push_back(std::make_unique<EtcdLock>(o_, ctx_.pid, log_, reporter_, *ctx_.etcd, target_));
  }
  locks_.push_back(std::make_unique<LocalLock>(o_, ctx_.pid, log_, dir_, target_));
}

// One conflict path for every lock: a skip, or a timeout with its row.
std::optional<Conclusion> Run::acquire(Lock& lock) {
  const Acquisition got = lock.acquire(plan_, ctx_.start_ns);
  facts_.waited_ns = sys::monotonic_ns() - ctx_.start_ns;
  if (got == Acquisition::Acquired) return std::nullopt;
  if (got == Acquisition::Busy) {
    reporter_.skip(lock.blocker());
    return Conclusion{exit_status(o_.skip_exit_code), RunOutcome::Skipped};
  }
  reporter_.timeout(lock.blocker(), plan_, facts_.waited_ns);
  return Conclusion{exit_status(o_.conflict_exit_code), RunOutcome::Timeout};
}

// The command's job, under every lock (-F: in looplock's place).
JobEnd Run::run_job() {
  try {
    if (o_.no_fork) exec_command(spec_, inherited_);
    JobEnd job = run_command(spec_, inherited_, log_);
    facts_.ran_ns = job.ended_ns - job.started_ns;
    return job;
  } catch (const Fatal&) {
    for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->abandon();
    throw;
  }
}

// The locks in reverse order, then the rows about a job looplock ended
// (written once it has ended, so that they can say how), then the one
// conclusion.
Conclusion Run::release(const JobEnd& job) {
  Ending ending{job, std::nullopt, true, false};
  for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->release(ending);
  if (job.ended_by == JobEnd::EndedBy::MaxTime) reporter_.max_time(job, ending.record);
  return conclude(job, ending.lease_lost, ending.intact);
}

Exit Run::finish(const Conclusion& c) {
  facts_.outcome = c.outcome;
  return c.exit;
}

}  // namespace looplock
