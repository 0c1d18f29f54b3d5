// Incident rows: one line of JSON (schema file_lock_incident_v0) appended to
// DIR/.state.lock.incidents.jsonl when a deadline passes. Appended with one
// write(2) on an O_APPEND descriptor, without taking the blocked lock; a
// failed append is the caller's warning, never a change of outcome.
#pragma once

#include "base/json.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/ids.hpp"
#include "records/holder.hpp"

namespace looplock {

inline constexpr std::string_view kIncidentSchema = "file_lock_incident_v0";
inline constexpr const char* kIncidentsName = ".state.lock.incidents.jsonl";

struct Incident {
  std::string at;
  std::string error_code = "lock_acquire_timeout";
  std::string lock_id;
  std::string policy;
  long long deadline_ms = 0;
  long long waited_ms = 0;
  std::optional<HolderRecord> holder;
  std::optional<bool> holder_alive;  // about the record's pid; null without a record
  std::vector<Pid> holder_pids;
  // The lock's verdict on the record (verdict.hpp's record_state_name:
  // "current", "stale", ...), the record as read when it is not the
  // holder's, and the verdict's warnings; each written only when set.
  std::string record_status;
  std::optional<HolderRecord> record;
  std::vector<std::string> warnings;
  Pid waiter_pid = 0;
  std::string waiter_agent;
  std::string waiter_operation;
  std::string operator_action;
  // The fields of the kind of lock the row is about, each under its key
  // (the cluster lock's: {"cluster": {"lock_name", "holder", ...}}).
  Json fields = Json::object();
  // Keys of rows about a job looplock ended (max_time_exceeded, lease_lost):
  // {"ran_ms", "killed", ...}, written before operator_action.
  Json details = nullptr;
};

Json incident_to_json(const Incident& i);
// One line, ending in "\n".
std::string encode_incident(const Incident& i);
// Validates one line (without or with its newline); nullopt if malformed.
std::optional<Json> parse_incident_line(std::string_view line);

// Appends `line` to DIR/.state.lock.incidents.jsonl with one write(2).
// Returns 0, or the errno of the failure (including EFBIG/ENOSPC, also for
// a write cut short by them; another short write as EIO, a symlink as ELOOP,
// a non-regular file as EINVAL).
int append_incident(int dirfd, const std::string& line);

struct IncidentSummary {
  size_t count = 0;        // rows in the file (lines that are not empty)
  std::vector<Json> recent;  // the newest valid rows, oldest first (at most the number asked for)
  std::optional<Json> latest;  // the newest valid row
  size_t examined = 0;     // rows read back from the end to find them
  size_t malformed = 0;    // of those, the ones that do not validate
  bool exists = false;
  int error = 0;           // why the file could not be read (it exists): errno, EINVAL for one not regular
};
// Reads the incidents file without following symlinks: the rows are counted
// (newlines, not parsed), and only the newest `recent` valid rows are parsed,
// read back from the end, so that a file of millions of rows costs a scan
// and bounded memory. At most kMaxExamined rows are read back.
inline constexpr size_t kMaxExamined = 4096;
IncidentSummary summarize_incidents(int dirfd, size_t recent = 1);

}  // namespace looplock
