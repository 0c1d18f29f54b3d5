// looplock --inspect DIR: who holds the lock, since when, is that process
// alive, what happened (incidents), and what to do. Reads only: never takes,
// breaks, creates or deletes anything.
#pragma once

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "holder.hpp"
#include "incident.hpp"
#include "log.hpp"
#include "options.hpp"
#include "procfs.hpp"

namespace looplock::etcd {
class Transport;
}

namespace looplock {

// Everything the report is built from, gathered once (so that the judgement
// below is a pure function, unit-tested without processes).
struct InspectFacts {
  std::string lock_path;  // DIR/.state.lock as given
  std::string lock_id;
  bool dir_unsafe = false;
  bool exists = false;
  std::optional<std::string> not_regular;  // "a symbolic link", ... when unsafe
  std::vector<procfs::KernelLock> kernel;
  // Set when the kernel's view cannot be seen whole (/proc/locks unreadable,
  // or nothing listed from inside a pid namespace of its own, where a holder
  // outside it is not listed): why. The report then says "unknown", never
  // "free".
  std::string kernel_unknown;
  HolderRead holder;
  std::optional<long long> age_ms;        // now - acquired_at
  std::optional<bool> pid_alive;          // kill(pid, 0); null when it cannot be told
  std::optional<bool> same_process;       // pid_start still matches; null when it cannot be read
  // How the record's pid is seen from here when that is not plain: "pid 1
  // in its own pid namespace, pid 4321 here", "not visible from this pid
  // namespace", ...
  std::string pid_note;
  IncidentSummary incidents;
  long long stale_after_ms = 0;
  std::optional<std::string> network_fs;  // "nfs", ... when DIR is on one
  // Kernel holder pids that have exited (the lock lives on in a descriptor
  // they passed on), and the processes found holding it through an fd.
  std::vector<pid_t> dead_kernel_pids;
  std::vector<pid_t> fd_holders;
  // The processes waiting for the lock (the kernel's blocked requests).
  struct Waiter {
    pid_t pid = 0;
    bool exclusive = true;
    std::string command;                  // base name (/proc/PID/comm), or "?"
    std::optional<std::string> agent_id;  // a looplock waiter's, when it can be read
    std::optional<std::string> operation;
    std::optional<long long> at_most_ms;  // the process's age: it cannot have waited longer
  };
  std::vector<Waiter> waiters;
};

struct InspectReport {
  Json json;  // the --json object
  std::string text;     // the human report
};

InspectReport build_report(const InspectFacts& facts);


// What a looplock process with these arguments would record as its agent and
// operation (nullopt when they do not parse).
std::optional<std::pair<std::string, std::string>> looplock_identity(const std::vector<std::string>& argv,
                                                                     const Environment& env);

// Runs --inspect for each DIR: prints one report each (with --json one
// object, or an array for several), returns the exit status: 66 or 71 when
// a DIR could not be inspected (the others are still reported), 1 with
// --check when a report carries a warning, else 0.
// `etcd` reads the cluster lock for --etcd (looplock-etcd's libcurl transport).
int inspect(const Options& options, const Logger& log, etcd::Transport* etcd);

}  // namespace looplock
