// The files a run uses beside the lock file (the run ledger, the incidents
// file) and in --metrics-dir, judged for the caller as a run by the caller
// would judge and use them: what a run would refuse (exit 73), or lose data
// to (an incident row, a metrics update), with the reason and the fix.
// --inspect warns with them (and --check fails on them); a run still judges
// each file itself when it uses it.
#pragma once

#include <string>
#include <vector>

#include "os/ids.hpp"
#include "records/lockfile.hpp"

namespace looplock {

struct FileProblem {
  std::string file;     // its path, as DIR (or METRICS-DIR) was given
  std::string problem;  // what a run by the caller does with it, and why
  std::string fix;
};

// DIR/.state.lock (missing where a run cannot create it: a read-only file
// system, a DIR the caller may not write), DIR/.state.lock.runs.json and
// DIR/.state.lock.incidents.jsonl, for a run by `euid`. Another file that
// does not exist is no problem (a run creates it).
std::vector<FileProblem> judge_lock_files(const LockDir& dir, Uid euid);

// METRICS-DIR/looplock_<lock_id>.prom and its update lock, for a run by
// `euid`: the directory missing or not writable, an update lock the caller
// cannot open or that any user can hold, a file the collector (another
// user) cannot read.
std::vector<FileProblem> judge_metrics_files(const std::string& metrics_dir, const std::string& lock_id, Uid euid);

}  // namespace looplock
