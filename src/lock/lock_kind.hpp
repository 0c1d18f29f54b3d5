// A kind of lock that a run takes besides the local one, and that only some
// programs have: the cluster lock on etcd is built into looplock-etcd alone
// (its HTTP client is libcurl's), so the static looplock links none of its
// code and hands a run that asks for it to looplock-etcd
// (cli/cluster_exec.hpp). The program that has the kind gives it to
// main_program() (cli/app.hpp); the run (run/run.hpp) and --inspect
// (cli/inspect.hpp) reach it through this interface only, and never name it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/environment.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "lock/lock.hpp"
#include "lock/report.hpp"
#include "os/ids.hpp"
#include "records/lock_id.hpp"
#include "settings/settings.hpp"

namespace looplock {

// What a kind adds to --inspect's report of one DIR.
struct InspectPart {
  Json json = nullptr;             // the report's object under the kind's key
  std::vector<std::string> lines;  // text lines, each shown after the key
  // What needs an operator's eye (the report's warnings: --check fails).
  std::vector<std::string> warnings;
  int status = 0;                  // the exit status when its lock could not be read (0: it could)
};

class LockKind {
public:
  virtual ~LockKind() = default;
  // Its name in --inspect's report: the JSON key, the text lines' label.
  virtual std::string key() const = 0;
  // A run's lock of this kind for `target`, taken before the local lock and
  // released after it: what every lock is asked for (`request`), and the
  // kind's own part of the settings, which it takes from `o`.
  virtual std::unique_ptr<Lock> make(const Options& o, const LockRequest& request, const LockTarget& target, Pid pid,
                                     const Logger& log, const Reporter& reporter) = 0;
  // A run nested in an outer looplock (pid `outer_pid`) that holds the local
  // lock: returns when the outer one holds this kind's lock for `target`
  // too, and throws Fatal otherwise (taking it inside the local lock would
  // take the two in the wrong order).
  virtual void confirm_outer(const Options& o, const LockTarget& target, const EnvList& env, long long outer_pid,
                             const Logger& log) = 0;
  // A hold's later step (--hold), confirmed inside the hold: the hold's lock
  // of this kind kept alive by this run too while its command runs (its
  // lease renewed, lost as any holder's), from what the hold's holder
  // exported to it (`exports`: the hold's key, lease and token).
  virtual std::unique_ptr<Lock> join_hold(const Options& o, const LockRequest& request, const LockTarget& target,
                                          Pid pid, const Logger& log, const Reporter& reporter,
                                          const EnvList& exports, Pid holder) = 0;
  // --inspect: its part of the report on the loop directory `canonical_dir`.
  virtual InspectPart inspect(const Options& o, const std::string& canonical_dir, const Logger& log) = 0;
};

}  // namespace looplock
