// One verdict on a lock. Its state is judged once, as data, from the facts
// gathered about it (survey.hpp): the processes the kernel shows holding it,
// the holder record and whether its process lives, the lock file's safety as
// a run judges it. Every report renders this verdict and decides nothing on
// its own: the timeout, skip and wait lines, incident rows, --inspect's text
// and JSON, and --check.
//
// The rule that keeps operators from being sent after the wrong process: a
// holder record names the holder only when the kernel names its pid (the same
// process: its start time matches), or when a process that inherited the
// locked descriptor from it holds the lock now. Otherwise the holder is what
// the kernel shows ("pid N (flock): no looplock record") and the record is
// reported as stale.
//
// Pure: no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.hpp"
#include "base/text.hpp"
#include "os/ids.hpp"
#include "records/holder.hpp"
#include "records/lockfile.hpp"

namespace looplock {

// A process the kernel shows holding the lock, confirmed through its
// descriptor.
struct LockHolder {
  Pid pid = 0;
  bool exclusive = true;
  // The pid /proc/locks names when this process holds the lock through a
  // descriptor that process locked and passed on (and has exited since); 0
  // when /proc/locks names this process itself.
  Pid locked_by = 0;
  std::string command;               // its base name (/proc/PID/comm); empty when unknown
  std::optional<std::string> start;  // its start time, as a record's pid_start
  std::optional<Uid> uid;            // its real uid
  std::vector<Gid> gids;             // its groups (real, effective, supplementary), when known
  // /proc/locks names it but it has exited, and the process that holds the
  // lock through the descriptor it passed on could not be found.
  bool exited = false;
};

struct LockFacts {
  std::string lock_path;  // DIR/.state.lock as given, for messages
  // The file, judged as a run judges it.
  bool exists = true;
  std::optional<Refusal> refusal;  // why every run refuses it (73)
  bool others_can_read = false;    // any local user can open it, so take the lock
  std::optional<Uid> file_uid;
  std::optional<Uid> dir_uid;
  // The lock file's group, when its members may open it (group-readable):
  // a member of that group holds the lock as looplock-files(5)'s group recipe has it.
  std::optional<Gid> sharing_gid;
  bool group_can_write = false;  // the lock file is group-writable (a member's looplock writes its record)
  std::optional<std::string> network_fs;
  // The kernel.
  bool seen_held = false;             // this run's own attempt found the lock held
  std::vector<LockHolder> holders;    // who holds it
  std::string kernel_unknown;         // why the kernel's view is not whole ("": it is)
  // Where the system lists no lock holders (Windows), the lock was tested by
  // taking it instead: held or free, and in which mode, is known; who holds
  // it and who waits is not (the record names the holder).
  bool tested_by_taking = false;
  bool tested_exclusive = false;      // tested_by_taking and held: whether exclusively
  // The system lists no lock holders or waiters (Windows): set with
  // tested_by_taking, and for a lock file that is missing (nothing to take).
  bool holders_unlisted = false;
  std::vector<Pid> dead_kernel_pids;  // pids /proc/locks names that have exited
  // The record, and its process.
  HolderRead record;
  std::optional<long long> record_age_ms;
  std::optional<bool> record_pid_alive;     // nullopt: cannot be told
  std::optional<bool> record_same_process;  // nullopt: cannot be compared
  std::optional<Pid> record_pid_here;       // its pid as seen here, when it wrote it in a pid namespace of its own
  std::string record_pid_note;              // how its pid is seen from here, when that is not plain
  long long stale_after_ms = 2LL * 3600 * 1000;
};

enum class LockState { Free, Held, Unknown };

// What the record is, judged against the kernel.
enum class RecordState {
  None,         // no record (no file, an empty file, or it could not be read)
  Unreadable,   // bytes that are not a holder record
  Current,      // it names the holder
  Unconfirmed,  // it claims the lock, its process lives, and the kernel cannot confirm it
  Stale,        // it claims the lock, and another process holds it
  Released,     // its holder released the lock
  Ended,        // an -F run's, whose process has exited (an -F run writes no release)
  Crashed,      // it claims the lock, the lock is free, and its process is gone
  Idle,         // it claims the lock, the lock is free, and its process lives
  NotRead,      // the lock file could not be read here (permission): the record is not known
};
std::string_view record_state_name(RecordState s);

struct Verdict {
  LockState state = LockState::Free;
  bool exclusive = false;
  std::vector<LockHolder> holders;  // who holds it, as the kernel shows them
  RecordState record = RecordState::None;
  std::optional<HolderRecord> read;  // the valid record as read (whatever its state)
  std::optional<bool> read_alive;    // whether its process lives (and is the same one); nullopt: unknown
  // Current through a descriptor that the record's looplock passed on before
  // it exited (what its command started keeps the lock).
  bool left_by_looplock = false;
  // Held by looplocks the lock file is read-only for (a group's member under
  // umask 022): no record, and no warning.
  bool read_only_holder = false;
  std::vector<Pid> confirm;  // whom an operator confirms stalled before terminating
  std::vector<std::string> warnings;
  std::string action;  // what to do, one sentence
};

Verdict judge(const LockFacts& facts);

// Who holds the lock, for every line that names it: "pid 16959 (agent cron,
// operation status.py, policy mutation, since 2026-11-30T18:22:44.356Z)",
// "pid 26669 (flock): no looplock record", "pid 10450 (sleep), left holding
// the lock by looplock pid 10449 (...), which has exited", "none", ...
std::string holder_phrase(const Verdict& v);

// "pid 1234, agent cron, operation status.py, policy mutation"
std::string record_summary(const HolderRecord& r);

// --- the cluster lock (--etcd) ---------------------------------------------------
//
// Who holds it and who waits, as the contenders' key values (holder JSON)
// say: "host h1 pid 12 (agent a, operation o, since T)", or a description of
// a contender that left no value (etcdctl lock).
std::string describe_cluster_holder(const std::optional<Json>& holder);
// "host h2 pid 13 (agent a, operation o, queued T)": a waiter, whose value's
// acquired_at (queued_at in --inspect --json) says when it queued.
std::string describe_cluster_waiter(const std::optional<Json>& waiter);

// The cluster holder as an operator on `this_host` meets it.
struct ClusterVerdict {
  std::string holder;         // describe_cluster_holder
  bool on_this_host = false;  // the holder's value names this host
  std::string confirm;        // "pid 12" when it is on this host, else "the holder"
};
ClusterVerdict judge_cluster(const std::optional<Json>& holder, const std::string& this_host);

}  // namespace looplock
