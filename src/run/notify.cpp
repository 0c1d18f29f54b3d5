#include "run/notify.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "job/job.hpp"
#include "os/signal_names.hpp"
#include "os/sys.hpp"
#include "os/wait_status.hpp"
#include "records/holder.hpp"

namespace looplock {

namespace {

constexpr size_t kReadChunk = 64 * 1024;

std::string text_of(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// The relay's side: reads the events, delivers the wanted ones, and keeps
// --notify-after's clock. Its own lines (a notifier that failed) go to
// looplock's stderr as looplock's would.
class Relay {
public:
  Relay(const NotifySettings& s, const EnvList& env, const Logger& log) : s_(s), env_(env), log_(log) {}

  int loop(int fd) {
    std::string buf;
    for (;;) {
      if (!sys::wait_readable(fd, held_at_)) {
        held_too_long();
        continue;
      }
      const auto chunk = sys::read_some(fd, kReadChunk);
      if (!chunk || chunk->empty()) break;
      buf += *chunk;
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
        handle(buf.substr(0, nl));
      }
    }
    return 0;
  }

private:
  void handle(const std::string& line) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return;
    const std::string event = text_of(j, "event");
    if (event == "started" && s_.after) {
      started_ = j;
      started_at_ = MonotonicClock::now();
      held_at_ = *started_at_ + *s_.after;
    } else if (event == "ended") {
      held_at_.reset();
    }
    if (notify_wanted(s_, event, text_of(j, "level"))) deliver(event, j);
  }

  void held_too_long() {
    held_at_.reset();
    const Json j = held_too_long_event(started_, MonotonicClock::now() - *started_at_, *s_.after);
    // looplock's own warning line, as it writes every line (unless -q).
    if (!log_.is_quiet()) {
      (void)sys::write_all(
          log_.fd(), log_.is_text() ? "looplock: " + printable(text_of(j, "message")) + "\n" : dump_json(j) + "\n");
    }
    if (notify_wanted(s_, "held_too_long", "warning")) deliver("held_too_long", j);
  }

  void deliver(const std::string& event, const Json& j) {
    const sys::NotifierEnd end =
        sys::run_notifier(s_.command, notifier_env(env_, event), dump_json(j) + "\n", s_.timeout);
    std::string why;
    if (!end.started) {
      why = "could not be started: " + std::string(std::strerror(end.err));
    } else if (end.timed_out) {
      why = "did not end within --notify-timeout " + format_duration(s_.timeout) + " and was KILLed with its group";
    } else if (const auto ending = sys::ending_of(end.status); ending && ending->by_signal) {
      why = "was killed by signal " + std::to_string(ending->value) + " (" + signal_name(ending->value) + ")";
    } else if (shell_status(end.status) != 0) {
      why = "exited with " + std::to_string(shell_status(end.status));
    }
    if (!why.empty()) {
      std::string said = end.output;
      while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
      if (const size_t nl = said.rfind('\n'); nl != std::string::npos) said.erase(0, nl + 1);
      log_.warn("notify_failed",
                "--notify's command for " + event + " " + why +
                    (said.empty() ? std::string() : " (its last line: " + said + ")") +
                    "; looplock's exit status is the run's",
                // looplock's pid, as on every line of its run (not the relay's)
                {{"pid", j.contains("pid") ? j["pid"] : Json(nullptr)},
                 {"lock_id", j.contains("lock_id") ? j["lock_id"] : Json(nullptr)},
                 {"notified_event", event},
                 {"output", end.output}});
    }
  }

  const NotifySettings& s_;
  const EnvList& env_;
  const Logger& log_;
  Json started_ = Json::object();
  std::optional<Instant> started_at_;
  Deadline held_at_;
};

}  // namespace

bool notify_wanted(const NotifySettings& s, const std::string& event, const std::string& level) {
  if (event == "notify_failed") return false;  // never a notifier about a notifier
  if (s.on.empty()) return level == "warning" || level == "error" || event == "held_too_long";
  return std::any_of(s.on.begin(), s.on.end(), [&](const std::string& n) { return n == "all" || n == event; });
}

EnvList notifier_env(const EnvList& env, const std::string& event) {
  return env_with(env, {{env_name::kEvent, event}},
                  {env_name::kFd, env_name::kHolderPid, env_name::kHolderFd, env_name::kEtcdPassword});
}

// The events a run can have (looplock-events(7)'s LOG LINES table, and the three
// only --notify hears); test_docs.py checks the two lists agree.
constexpr std::array kEvents = {
    "usage_error", "nested_cluster_lock", "dir_missing", "not_a_directory", "dir_path_unusable", "unsafe_loop_dir",
    "unsafe_lock_file", "lock_file_unusable", "unsafe_run_ledger", "run_ledger_unusable", "unsafe_coalesce_seat",
    "coalesce_unusable", "unsafe_holder_index", "nested_in_shared", "hold_fd_unavailable", "hold_tie_ended",
    "hold_value_invalid", "hold_not_live", "hold", "hold_ended", "hold_steps_running", "no_such_hold", "os_error", "out_of_memory",
    "stdout_write_failed", "internal_error", "command_not_found", "command_not_executable", "etcd_unreachable",
    "etcd_error", "etcd_helper_missing", "error", "lock_acquire_timeout", "max_time_exceeded", "lease_lost",
    "loop_dir_vanished", "noop-locked", "noop-already-run", "noop-coalesced", "lock_leaked", "kill_after", "warned",
    "warning_not_sent", "ledger_damaged", "ledger_ahead", "ledger_crowded", "ledger_write_failed", "lock_file_replaced",
    "holder_index_replaced", "read_only_lock_file", "holder_write_failed", "incident_append_failed",
    "unsafe_incidents_file", "intact_unknown", "network_file_system", "metrics_write_failed", "terminal",
    "password_file_readable", "waiting", "acquired", "released", "jitter", "held_too_long", "notify_failed",
    "notify_unavailable", "coalesced", "absorb_unrecorded", "coalesce_unavailable", "nested", "etcd_unavailable",
    "etcd_answering", "lease_expired",
    // --notify's own
    "started", "ended", "skipped"};

std::optional<std::string> unnotifiable_event(const std::string& name) {
  if (name == "all") return std::nullopt;
  if (name == "usage_error" || name == "notify_failed" || name == "notify_unavailable") {
    return "a run never notifies " + name;
  }
  if (std::find(kEvents.begin(), kEvents.end(), name) == kEvents.end()) return "no such event";
  return std::nullopt;
}

Json held_too_long_event(const Json& started, Duration held, Duration after) {
  Json j = Json::object();
  j["ts"] = sys::utc_now_iso8601();
  j["pid"] = started.contains("pid") ? started["pid"] : Json(nullptr);
  j["level"] = "warning";
  j["event"] = "held_too_long";
  if (started.contains("lock_id")) j["lock_id"] = started["lock_id"];
  const std::string op = text_of(started, "operation");
  j["message"] = "held_too_long: " + (op.empty() ? std::string("the command") : op) + " has held the lock for " +
                 format_duration(held) + " and goes on (--notify-after " + format_duration(after) + ")";
  j["operation"] = op;
  j["held_ms"] = ms_of(held);
  j["notify_after_ms"] = ms_of(after);
  return j;
}

void say_ended(const Logger& log, const std::string& name, RunOutcome outcome, int exit_status, Duration ran,
               std::optional<Duration> waited, const Json& more) {
  if (!log.has_sink()) return;
  const std::string operation = clip_bytes(name);  // as records clip it
  Json fields = {{"operation", operation},
                 {"outcome", outcome_name(outcome)},
                 {"exit_status", exit_status},
                 {"ran_ms", ms_of(ran)}};
  if (waited) fields["waited_ms"] = ms_of(*waited);
  fields.update(more);
  log.event("info", "ended",
            operation + " ended: " + std::string(outcome_name(outcome)) + ", exit status " +
                std::to_string(exit_status) + (waited ? " after waiting " + format_duration(*waited) : ""),
            fields);
}

Notifier::Notifier(const NotifySettings& settings, const EnvList& env, const Logger& log) : log_(log) {
  // The relay's lines: looplock's, without the sink (which is in this process).
  const Logger relay_log(log.is_quiet() ? Verbosity::Quiet : Verbosity::Normal,
                         log.is_text() ? LogFormat::Text : LogFormat::Json, log.fd());
  relay_ = sys::start_relay([&](int fd) { return Relay(settings, env, relay_log).loop(fd); });
  if (!relay_) {
    log.warn("notify_unavailable", errno_message("cannot start --notify's relay; no event will be notified", errno));
  }
}

Notifier::~Notifier() { finish(); }

void Notifier::take(const Json& event) {
  if (!relay_) return;
  // Never blocks: a relay that is gone loses the rest (never an error).
  sys::send_event(*relay_, dump_json(event) + "\n");
}

void Notifier::finish() {
  if (!relay_) return;
  sys::finish_relay(*relay_);
  if (relay_->dropped > 0) {
    log_.warn("notify_failed", std::to_string(relay_->dropped) +
                                   " event(s) were not notified: --notify's relay was more than 1 MiB of events "
                                   "behind (a notifier slower than the run's events)");
  }
  relay_.reset();
}

}  // namespace looplock
