#include "run/stack.hpp"

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "local/local_lock.hpp"
#include "os/file_status.hpp"
#include "records/hold.hpp"
#include "records/nesting.hpp"

namespace looplock {

namespace {

LockKind& cluster_of(const Context& ctx) {
  if (!ctx.cluster) throw Fatal(exit_code::kOsError, "internal error: an --etcd run without the cluster lock");
  return *ctx.cluster;
}

// Who a nested run confirms holds the cluster lock: the outer looplock, or,
// inside a hold's step, the hold (its holder has the cluster key).
std::pair<EnvList, long long> cluster_outer(const Context& ctx, const LockTarget& target, Pid outer_pid) {
  if (const auto text = env_get(ctx.env, env_name::kHold)) {
    if (const auto v = parse_hold_value(*text); v && v->lock_id == target.lock_id && !v->etcd_key.empty()) {
      return {env_with(ctx.env, {{env_name::kEtcdKey, v->etcd_key}}), v->pid};
    }
  }
  return {ctx.env, outer_pid != 0 ? outer_pid : ctx.pid};
}

// A second --hold in a job whose LOOPLOCK_HOLD names a live hold of this
// very lock would wait for that hold for ever (or until -w): refused.
void refuse_hold_inside_hold(const Context& ctx, const LockDir& dir, const LockTarget& target) {
  const std::optional<std::string> text = env_get(ctx.env, env_name::kHold);
  const std::optional<HoldValue> v = text ? parse_hold_value(*text) : std::nullopt;
  sys::FileStatus lock_file;
  if (!v || v->lock_id != target.lock_id || !sys::status_at(dir.fd.get(), kLockName, lock_file)) return;
  if (!check_hold(*v, dir.fd.get(), lock_file).live) return;
  throw Fatal(exit_code::kUsage,
              "--hold while $LOOPLOCK_HOLD names a hold of " + target.loop + "'s lock that is held now (looplock pid " +
                  std::to_string(v->pid) + "): the new hold would wait for it",
              "This job holds the lock already: run its steps inside that hold, or release it first "
              "(looplock --release).",
              "usage_error");
}

}  // namespace

Stack build_stack(const StackSite& s) {
  const Options& o = s.options;
  const Context& ctx = s.context;
  Stack stack;
  sys::FileStatus lock_file;
  if (auto outer = outer_holder(s.request, ctx.env, s.dir, ctx.pid, lock_file)) {
    if (!o.cluster.etcd.empty()) {
      const auto [env, pid] = cluster_outer(ctx, s.target, outer->pid);
      cluster_of(ctx).confirm_outer(o, s.target, env, pid, s.log);
    }
    stack.locks.push_back(
        std::make_unique<InheritedLock>(s.request, s.log, s.dir, *outer, lock_file, s.target, ctx.pid));
    stack.nested = true;
    return stack;
  }
  // A later step of a hold across steps (--hold): inside it, once it is
  // confirmed (with --etcd, on the cluster too, by the key the value names),
  // and with --etcd keeping the hold's lease alive while its command runs:
  // the command ends before that lease can expire, as any holder's does.
  std::string hold_key;
  if (o.mode == Mode::Hold) refuse_hold_inside_hold(ctx, s.dir, s.target);
  if (o.mode == Mode::Run) {
    if (auto hold = hold_holder(ctx.env, s.dir, s.target, s.log, lock_file, hold_key)) {
      if (o.cluster.etcd.empty() && !hold_key.empty()) {
        // Only a step's own renewals keep the hold's lease alive while it
        // runs (the hold may end, or its holder be KILLed, meanwhile):
        // without the cluster, its command could outlive the lease.
        throw Fatal(exit_code::kUsage,
                    "this step runs inside a hold (looplock pid " + std::to_string(hold->pid) +
                        ") that holds a cluster lock on etcd (key " + printable(hold_key) +
                        "), but it was given no --etcd: it could not keep that lock's lease alive while its command "
                        "runs",
                    "Give the step the --etcd (or $LOOPLOCK_ETCD) and --lock-name the hold was taken with. The "
                    "command did not run.",
                    "nested_cluster_lock");
      }
      if (!o.cluster.etcd.empty()) {
        EnvList exports;
        for (const auto& [name, value] : hold->exports) exports.push_back(std::string(name) + "=" + value);
        // First: a step of another lock name is told so.
        auto joined =
            cluster_of(ctx).join_hold(o, s.request, s.target, ctx.pid, s.log, s.reporter, exports, hold->pid);
        const EnvList env = hold_key.empty() ? env_with(ctx.env, {}, {env_name::kEtcdKey})
                                             : env_with(ctx.env, {{env_name::kEtcdKey, hold_key}});
        cluster_of(ctx).confirm_outer(o, s.target, env, hold->pid, s.log);
        stack.locks.push_back(std::move(joined));
      }
      stack.locks.push_back(
          std::make_unique<InheritedLock>(s.request, s.log, s.dir, *hold, lock_file, s.target, ctx.pid));
      stack.nested = true;
      return stack;
    }
  }
  if (!o.cluster.etcd.empty()) {
    stack.locks.push_back(cluster_of(ctx).make(o, s.request, s.target, ctx.pid, s.log, s.reporter));
  }
  stack.locks.push_back(std::make_unique<LocalLock>(s.request, ctx.pid, s.log, s.dir, s.target));
  return stack;
}

}  // namespace looplock
