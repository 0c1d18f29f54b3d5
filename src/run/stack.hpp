// The locks of a run, built by one factory from the settings: what a run
// needs of its situation (Context), and the stack in the order the locks are
// taken. A new kind of lock is one class in a folder of its own and one line
// in build_stack(); Run's unit tests give Run a factory of their own.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/environment.hpp"
#include "base/log.hpp"
#include "lock/lock.hpp"
#include "lock/lock_kind.hpp"
#include "lock/report.hpp"
#include "os/ids.hpp"
#include "records/lock_id.hpp"
#include "records/lockfile.hpp"
#include "settings/settings.hpp"

namespace looplock {

struct Context {
  EnvList env;  // the environment looplock was started with
  Pid pid = 0;
  Instant start;                // when looplock started
  long long start_wall_ms = 0;  // the same instant on the wall clock (ms since the epoch)
  // The cluster lock (--etcd): looplock-etcd's, null in looplock, which
  // hands runs with --etcd to looplock-etcd (cli/cluster_exec.hpp).
  LockKind* cluster = nullptr;
  // --hold's holder: called once every lock is held, just before the
  // sentinel starts, with the command it makes the sentinel's (its
  // environment, the report descriptor); throws Fatal when the hold must
  // not go on (cli/hold.hpp).
  std::function<void(CommandSpec&)> on_held;
};

// What a factory builds a run's stack from: DIR open, and what it is called.
struct StackSite {
  const Options& options;
  const LockRequest& request;  // made from the options once (settings.hpp)
  const Context& context;
  const Logger& log;
  const Reporter& reporter;
  LockDir& dir;  // the local lock keeps it
  const LockTarget& target;
};

struct Stack {
  std::vector<std::unique_ptr<Lock>> locks;  // in the order they are taken
  bool nested = false;                       // inside an outer looplock that holds this lock
};

using StackFactory = std::function<Stack(const StackSite&)>;

// The stack: inside an outer looplock that holds DIR's lock, only that one
// (held already; with --etcd, once the outer one is confirmed to hold the
// cluster lock too); else the cluster lock first, when asked for, and the
// local one second, always in that order, so that two hosts never wait for
// each other crosswise.
Stack build_stack(const StackSite& site);

}  // namespace looplock
