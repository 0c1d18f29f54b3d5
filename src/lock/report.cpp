#include "lock/report.hpp"

#include <algorithm>
#include <cerrno>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "os/ids.hpp"
#include "os/signal_names.hpp"
#include "os/sys.hpp"
#include "records/lockfile.hpp"

namespace looplock {

namespace {

Json job_details(const JobEnd& job) {
  Json j{{"ran_ms", ms_of(job.ended - job.started)},
         {"killed", job.killed},
         {"ran_after_term_ms", job.term_sent ? ms_of(job.ended - *job.term_sent) : 0}};
  // --warn-before: the warning the job had, and how long before its end.
  if (job.warned) {
    j["warned"] = Json{{"signal", signal_name(job.warn_signal)},
                       {"before_end_ms", ms_of(job.ended - *job.warned)},
                       {"pids", job.warned_pids},
                       {"skipped", job.warn_skipped}};
  }
  return j;
}

const char* how_it_ended(const JobEnd& job) { return job.killed ? "KILL was needed" : "TERM sufficed"; }

// -p coalesce: the runs a waiter that gave up had absorbed.
std::string absorbed_note(const Blocker& b) {
  const auto it = b.fields.find("coalesced");
  if (it == b.fields.end() || !it->is_number_integer() || it->get<int>() == 0) return "";
  const int n = it->get<int>();
  return " and the " + std::to_string(n) + " later run" + (n == 1 ? "" : "s") + " of it that it absorbed";
}

// A limit in whole ms, rounded up: one above zero is never 0 (no limit).
long long limit_ms(Duration d) { return std::chrono::ceil<std::chrono::milliseconds>(d).count(); }

}  // namespace

Incident Reporter::incident(std::string error_code) const {
  Incident inc;
  inc.at = sys::utc_now_iso8601();
  inc.error_code = std::move(error_code);
  inc.lock_id = lock_id_;
  inc.policy = std::string(policy_name(policy_));
  inc.waiter_pid = pid_;
  inc.waiter_agent = identity_.agent;
  inc.waiter_operation = identity_.operation;
  return inc;
}

// The row is the audit trail of what looplock did: appended first (one
// write), and a failure to append only adds a warning.
void Reporter::append(const Incident& inc) const {
  const int err = append_incident(dirfd_, encode_incident(inc));
  if (err == 0) return;
  const std::string path = sys::path_in_dir(dir_, kIncidentsName);
  // A file looplock refuses to write (append_incident's errors for it).
  const char* why = err == ELOOP    ? "it is a symbolic link (looplock never writes through one)"
                    : err == EISDIR ? "it is a directory"
                    : err == EINVAL ? "it is not a regular file (a FIFO, socket or device)"
                    : err == EMLINK ? "it has more than one hard link"
                                    : nullptr;
  if (why) {
    log_.warn("unsafe_incidents_file",
              "unsafe incidents file " + path + ": " + why + "; the incident row was not written",
              {{"error_code", inc.error_code}});
    return;
  }
  log_.warn("incident_append_failed", errno_message("cannot append the incident row to " + path, err));
}

Json Reporter::fields(const Blocker& b) const {
  Json j = {
      {"lock_id", lock_id_}, {"policy", policy_name(policy_)}, {"holder_pids", Json::array()}, {"holder", nullptr}};
  const HolderFacts& h = b.holders;
  for (Pid pid : h.pids) j["holder_pids"].push_back(pid);
  if (h.holder) j["holder"] = holder_to_json(*h.holder);
  if (!h.record_status.empty()) j["record_status"] = h.record_status;
  if (h.record) j["record"] = holder_to_json(*h.record);
  if (!h.warnings.empty()) j["warnings"] = h.warnings;
  j.update(b.fields);
  return j;
}

void Reporter::skip(const Blocker& b) const {
  log_.result("noop-locked",
              "noop-locked: " + b.what + " is held by " + b.who + "; skipped " + identity_.operation +
                  " (policy single_flight)",
              fields(b));
}

void Reporter::coalesced(const Blocker& b) const {
  log_.result("noop-coalesced",
              "noop-coalesced: " + (b.waiting.empty() ? std::string("a run whose record cannot be read") : b.waiting) +
                  " already waits to run " + identity_.operation + " once " +
                  (b.frees_when.empty() ? b.what + " is free" : b.frees_when) + " (held by " + b.who +
                  "); skipped " + identity_.operation + " (policy coalesce)",
              fields(b));
}

void Reporter::already_run(const RunEntry& run, Duration once_per, const Blocker* holding,
                           const std::string& ledger) const {
  const std::string who = holding ? describe_run(run) + "; its run holds the lock now: " + holding->what +
                                        " is held by " + holding->who
                                  : describe_run(run);
  log_.result("noop-already-run",
              "noop-already-run: " + identity_.operation + " already ran in this slot (--once-per " +
                  format_duration(once_per) + ") on " + who + "; skipped " + identity_.operation + " (" + ledger + ")",
              {{"lock_id", lock_id_},
               {"policy", policy_name(policy_)},
               {"once_per_ms", ms_of(once_per)},
               {"running_now", holding != nullptr},
               {"last_run", run_entry_to_json(run)}});
}

void Reporter::timeout(const Blocker& b, const WaitPlan& plan, Duration waited, int exit_status) const {
  Incident inc = incident("lock_acquire_timeout");
  inc.deadline_ms = limit_ms(plan.timeout);
  inc.waited_ms = ms_of(waited);
  inc.holder_pids = b.holders.pids;
  inc.holder = b.holders.holder;
  inc.holder_alive = b.holders.holder_alive;
  inc.record_status = b.holders.record_status;
  inc.record = b.holders.record;
  inc.warnings = b.holders.warnings;
  inc.fields = b.fields;
  if (b.ended_by_signal != 0) inc.fields["signal"] = signal_name(b.ended_by_signal);
  inc.operator_action = operator_action(policy_, b.confirm, b.many) + b.action_extra;
  append(inc);
  Json f = fields(b);
  f["waited_ms"] = inc.waited_ms;
  f["deadline_ms"] = inc.deadline_ms;
  f["exit_status"] = exit_status;
  if (b.ended_by_signal != 0) f["signal"] = signal_name(b.ended_by_signal);
  log_.error("lock_acquire_timeout",
             b.ended_by_signal != 0
                 ? "lock_acquire_timeout: signal " + signal_name(b.ended_by_signal) + " ended the wait for " + b.what +
                       " (held by " + b.who + ") after " + format_duration(waited) + "; gave up " +
                       identity_.operation + absorbed_note(b) + (absorbed_note(b).empty() ? "" : ", none of which ran") +
                       " (policy " + inc.policy + ")"
                 : "lock_acquire_timeout: " + b.what + " still held after " + format_duration(waited) + " by " +
                       b.who + "; gave up " + identity_.operation + absorbed_note(b) + " (policy " + inc.policy + ")",
             "Run '" + b.inspect_hint + "' to see the holder; never delete the lock file.", f);
}

void Reporter::max_time(const JobEnd& job, Duration max_time, const std::optional<HolderRecord>& record, bool leaked,
                        const std::string& from) const {
  Incident inc = incident("max_time_exceeded");
  inc.deadline_ms = limit_ms(max_time);
  inc.waited_ms = ms_of(job.ended - job.started);
  inc.holder = record;
  inc.holder_alive = record ? std::optional<bool>(true) : std::nullopt;
  inc.holder_pids = {pid_};
  inc.details = job_details(job);
  inc.operator_action = std::string("The command ran longer than --max-time and looplock ended it (") +
                        (job.killed ? "it ignored TERM: KILL was needed" : "TERM sufficed") +
                        "); find out why it hung before the next run does too.";
  append(inc);
  Json f = {{"lock_id", lock_id_}, {"policy", policy_name(policy_)}, {"deadline_ms", inc.deadline_ms}};
  f.update(inc.details);
  log_.error("max_time_exceeded",
             "max_time_exceeded: " + identity_.operation +
                 (job.outer_ended ? std::string(" ran when the hold it ran inside ended (the process it is tied to ended)")
                  : !from.empty() ? " ran until " + from
                                  : " ran longer than --max-time " + format_duration(max_time)) +
                 " and was ended (" + how_it_ended(job) + ") after " + format_duration(job.ended - job.started),
             std::string(job.outer_ended ? "The hold ended first: it was not hung" : "Find out why it hung") +
                 (leaked ? "; the lock stays held by what it started outside its process group (lock_leaked above) "
                           "until that exits."
                         : "; the lock was released once the whole job had ended."),
             f);
}

void Reporter::lease_lost(const LeaseLoss& loss, const JobEnd& job, const std::optional<HolderRecord>& record) const {
  Incident inc = incident("lease_lost");
  inc.deadline_ms = ms_of(loss.ttl);
  inc.waited_ms = ms_of(loss.since_renewal);
  inc.holder = record;
  if (record) inc.holder_alive = true;
  inc.holder_pids = {pid_};
  inc.fields = loss.fields;
  inc.details = job_details(job);
  inc.details["ran_after_loss_ms"] = loss.lost_at ? ms_of(std::max(job.ended - *loss.lost_at, Duration::zero())) : 0;
  inc.operator_action = "The " + loss.lease + " was lost while the command ran (" + loss.why +
                        "), so another host may have taken the lock: the command was ended (" + how_it_ended(job) +
                        "). " + loss.check;
  append(inc);
  Json f = {{"lock_id", lock_id_}};
  f.update(loss.fields);
  f.update(inc.details);
  log_.error("lease_lost",
             "lease_lost: the " + loss.lease + " of " + loss.of + " was lost while " + identity_.operation +
                 " ran: " + printable(loss.why) + "; the command was ended (" + how_it_ended(job) + ")",
             loss.hint, f);
}

}  // namespace looplock
