// looplock --inspect DIR: who holds the lock, since when, is that process
// alive, what happened (incidents), and what to do. Reads only: never takes,
// breaks, creates or deletes anything. The judgement is the lock's verdict
// (verdict.hpp), the same one every run's lines render; this module renders
// it as the report (text and JSON).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "lock/lock_kind.hpp"
#include "base/log.hpp"
#include "cli/lock_files.hpp"
#include "cli/options.hpp"
#include "os/ids.hpp"
#include "records/incident.hpp"
#include "records/ledger.hpp"
#include "records/verdict.hpp"

namespace looplock {

// Everything the report is built from, gathered once (so that the report is
// a pure function, unit-tested without processes).
struct InspectFacts {
  std::string lock_id;
  LockFacts lock;  // what the verdict is judged from
  IncidentSummary incidents;
  // The processes waiting for the lock (the kernel's blocked requests).
  struct Waiter {
    Pid pid = 0;
    bool exclusive = true;
    std::string command;                  // base name (/proc/PID/comm), or "?"
    std::optional<std::string> agent_id{};  // a looplock waiter's, when it can be read
    std::optional<std::string> operation{};
    std::optional<long long> at_most_ms{};  // the process's age: it cannot have waited longer
    // -p coalesce: it sits in its operation's seat (records/coalesce.hpp):
    // later coalescing runs of the operation skip while it waits.
    bool coalescing = false;
  };
  std::vector<Waiter> waiters;
  // --holders' index files (records/holders.hpp), by index: who holds each.
  struct Index {
    int index = 0;
    bool held = false;
    bool unknown = false;                  // the kernel's view cannot be read (as the lock's: kernel_unknown)
    std::vector<Pid> pids;                 // the kernel's holders of it
    std::string holder;                    // held: the holder phrase (verdict.hpp)
    std::optional<HolderRecord> record{};  // the record in it, whoever wrote it
    bool record_current = false;           // the record is the holder's
  };
  std::vector<Index> indexes;
  // The run ledger of --once-per: the last run of each operation.
  std::vector<RunEntry> runs;
  std::vector<std::string> runs_damaged;  // the operations ("?": unknown) of entries that did not validate
  std::vector<std::string> dead_runs;     // the operations whose run has no end and a looplock proven dead
  std::string runs_error;                 // why the ledger could not be read, when it could not
  // The files beside the lock, and the metrics files, that a run by the
  // caller would refuse or lose data to (lock_files.hpp).
  std::vector<FileProblem> files;
};

struct InspectReport {
  Json json;         // the --json object
  std::string text;  // the human report
};

InspectReport build_report(const InspectFacts& facts);
// --holders: the warning when the held indexes' records disagree on N.
std::optional<std::string> holders_disagree(const std::vector<InspectFacts::Index>& indexes);

// The --json entry of a DIR that could not be inspected.
Json error_entry(const std::string& dir, int status, const std::string& event, const std::string& message,
                 const std::string& hint);

// What a looplock process with these arguments would record as its agent and
// operation (nullopt when they do not parse).
std::optional<std::pair<std::string, std::string>> looplock_identity(const std::vector<std::string>& argv,
                                                                     const Environment& env);

// Runs --inspect for each DIR: prints one report each (with --json one
// object, or an array with one entry per DIR, in order, for several; a DIR
// that cannot be inspected is an entry with its error), returns the exit
// status: 73, 66 or 71 when a DIR could not be inspected (the others are
// still reported), 1 with --check when a report carries a warning, else 0.
// `cluster` reads the cluster lock for --etcd (looplock-etcd's; null in looplock).
int inspect(const Options& options, const Logger& log, LockKind* cluster);

}  // namespace looplock
