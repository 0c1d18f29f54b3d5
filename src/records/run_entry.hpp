// The run ledger of --once-per: per operation, the last run of a lock (who
// ran it, when it started, whether and how it ended), so that a schedule
// runs once per DURATION across schedulers and hosts. Here, what every
// ledger shares, all of it pure: an entry, its codec, the slot's judgement
// and the update of a ledger's entries. The local ledger's file is
// ledger.hpp's; the cluster's lives on etcd (cluster.hpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.hpp"

namespace looplock {

inline constexpr std::string_view kRunsSchema = "looplock_runs_v0";
// The local ledger keeps this many operations; past it, the oldest whose
// slot is over go first. Entries inside their own slot are never dropped
// below kMaxLedgerEntries (the ledger grows, with a warning); past that, the
// oldest go whatever their slot.
inline constexpr size_t kMaxLedgerOperations = 64;
inline constexpr size_t kMaxLedgerEntries = 1024;

// One run, as a ledger keeps it.
struct RunEntry {
  std::string operation;  // the name as given, any bytes (stored losslessly)
  std::string host;
  long long pid = 0;
  std::string agent;
  long long started_ms = 0;  // when that looplock started (wall clock, ms since the epoch)
  std::optional<long long> ended_ms;
  std::optional<int> exit_status;        // the run's exit status (128+N for a signal), once ended
  long long fencing_token = 0;           // with --etcd
  std::optional<long long> once_per_ms;  // its --once-per (none in entries of earlier versions)
  // Who its looplock is, so that a dead one can be told on its own host:
  // its start time (field 22 of /proc/PID/stat), the boot and the pid
  // namespace it ran in; each empty when unknown (earlier versions).
  std::string pid_start;
  std::string boot_id;
  std::string pid_ns;
};

Json run_entry_to_json(const RunEntry& e);
// Strict: every field of the right type; nullopt otherwise (a damaged entry).
std::optional<RunEntry> run_entry_from_json(const Json& j);
// The same from an entry's JSON text (an etcd value): nullopt when it is not one.
std::optional<RunEntry> parse_run_entry(std::string_view text);

// Whether run `e` of an operation did the work of a tick of it that started
// at `started_ms` (wall clock): it ended, and started with or after it, or
// (--once-per) its slot held it, so the tick would have skipped.
bool run_covers(const RunEntry& e, long long started_ms);

// "host h1 pid 12 (agent cron), which started at T and ended at T2 with
// status 0": a run that ended is never presented as a live process.
std::string describe_run(const RunEntry& e);

// Whether the looplock that ran entry `e` is proven dead: it ran on this
// host (this boot, this process's pid namespace, by the entry's own
// record of them), and its pid is gone or is now another process (another
// start time). An entry from another host, or one without these facts (an
// earlier version), is never proven dead.
bool runner_proven_dead(const RunEntry& e);
// Whether that looplock is proven alive: on this host (this boot, this pid
// namespace) its pid is still the process that ran it (its start time).
bool runner_alive_here(const RunEntry& e);

// What a ledger's entry means for this run's slot.
enum class Slot {
  Free,     // no entry, or its run started DURATION ago or more: run
  Done,     // its run started within DURATION and ended: skip
  Running,  // started within DURATION, not ended: its run is on, or its looplock died before recording the end
  Damaged,  // started further in the future than DURATION: it does not count
};
struct SlotVerdict {
  Slot slot = Slot::Free;
  long long ahead_ms = 0;  // how far in the future it started (a clock difference), when it did
};
// `now_ms`: when this looplock started; `once_per_ms`: DURATION.
SlotVerdict judge_slot(const std::optional<RunEntry>& entry, long long now_ms, long long once_per_ms);

// What a look at a ledger found for one operation.
struct LedgerLook {
  std::optional<RunEntry> entry;
  bool damaged = false;  // its entry, or the whole ledger, did not validate (it is rewritten)
  bool answered = true;  // false: it could not be read (etcd did not answer a look without the lock)
  bool whole = false;    // damaged: the whole ledger (every operation's entry is lost)
};

// The ledger with `entry` in the place of its operation's (most recent
// last). Past kMaxLedgerOperations, the oldest entries whose slot is over at
// `now_ms` are dropped; `crowded` then says how many entries remain inside
// their slots (0: none beyond the limit), and `dropped_in_slot` how many of
// those had to go at kMaxLedgerEntries.
struct LedgerUpdate {
  std::vector<RunEntry> entries;
  size_t crowded = 0;
  size_t dropped_in_slot = 0;
};
LedgerUpdate with_entry(std::vector<RunEntry> entries, const RunEntry& entry, long long now_ms);
// The ledger's sealed text (sealed.hpp) as one copy of `generation`: the
// file keeps two copies, and a reader takes the valid one of the highest
// generation (ledger.hpp).
std::string encode_ledger(const std::vector<RunEntry>& entries, unsigned long long generation = 0);
}  // namespace looplock
