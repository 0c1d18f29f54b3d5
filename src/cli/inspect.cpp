#include "cli/inspect.hpp"

#include <cstdio>
#include <cstring>
#include <set>

#include "base/duration.hpp"
#include "base/environment.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/coalesce.hpp"
#include "records/holder.hpp"
#include "records/holders.hpp"
#include "records/lock_id.hpp"
#include "records/lockfile.hpp"
#include "records/survey.hpp"

namespace looplock {

namespace {

std::string ms_text(long long ms) { return format_duration(of_ms(ms)); }

const char* read_state_name(HolderRead::State s) {
  switch (s) {
    case HolderRead::State::Empty: return "empty";
    case HolderRead::State::Valid: return "valid";
    case HolderRead::State::Unreadable: return "unreadable";
    case HolderRead::State::Error: return "error";
  }
  return "error";
}

// The pids /proc/locks names: a holder's own, or the one that locked the
// descriptor it holds the lock through.
std::vector<Pid> kernel_named(const std::vector<LockHolder>& holders) {
  std::vector<Pid> out;
  for (const auto& h : holders) {
    const Pid p = h.locked_by != 0 ? h.locked_by : h.pid;
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

// "process" line of a record that claims the lock.
std::string process_text(const LockFacts& f, const HolderRecord& rec) {
  std::string proc = !f.record_pid_alive       ? "unknown"
                     : !*f.record_pid_alive    ? "dead"
                     : !f.record_same_process  ? "alive (its start time cannot be compared)"
                     : !*f.record_same_process ? "pid reused by another process"
                                               : "alive, same process";
  if (!f.record_pid_note.empty()) proc += ", " + f.record_pid_note;
  return proc + " (pid_start " + (rec.pid_start.empty() ? std::string("unknown") : rec.pid_start) + ")";
}

std::string record_state_text(RecordState s) {
  switch (s) {
    case RecordState::Current: return "current";
    case RecordState::Unconfirmed: return "unconfirmed (the kernel cannot confirm it)";
    case RecordState::Stale: return "stale (not the holder)";
    case RecordState::Released: return "released";
    case RecordState::Ended: return "ended (an -F run writes no release)";
    case RecordState::Crashed: return "left behind (its holder crashed or was killed)";
    case RecordState::Idle: return "not released (its process lives but does not hold the lock)";
    case RecordState::NotRead: return "not read (the lock file cannot be read here)";
    default: return std::string(record_state_name(s));
  }
}

// The latest incident row in a few words.
std::string incident_text(const Json& l) {
  const Json& w = l.contains("waiter") && l["waiter"].is_object() ? l["waiter"] : Json::object();
  const std::string who =
      "pid " + std::to_string(w.value("pid", 0)) + " (" + w.value("operation", std::string("?")) + ")";
  const std::string code = l.value("error_code", std::string("?"));
  std::string out = l.value("at", std::string("?")) + " " + code + ": ";
  if (l.contains("ran_ms") && l["ran_ms"].is_number_integer()) {
    return out + who + " ran " + ms_text(l["ran_ms"].get<long long>());  // a job looplock ended
  }
  return out + "waiter " + who + " waited " + ms_text(l.value("waited_ms", 0LL));
}

}  // namespace

Json error_entry(const std::string& dir, int status, const std::string& event, const std::string& message,
                 const std::string& hint) {
  Json j = Json::object();
  j["lock_file"] = sys::path_in_dir(dir, kLockName);
  j["error"] = {
      {"status", status}, {"event", event}, {"message", message}, {"hint", hint.empty() ? Json(nullptr) : Json(hint)}};
  return j;
}

namespace {

Json report_json(const InspectFacts& facts, const Verdict& v) {
  const LockFacts& f = facts.lock;
  const bool held = v.state == LockState::Held;
  const bool known = f.kernel_unknown.empty();
  const HolderRecord* rec = v.read ? &*v.read : nullptr;
  const std::vector<Pid> named = kernel_named(v.holders);

  Json j = Json::object();
  j["lock_file"] = f.lock_path;
  j["lock_id"] = facts.lock_id;
  j["exists"] = f.exists;
  const bool tested_mode = held && v.holders.empty() && f.tested_by_taking;
  j["kernel"] = {{"held", held || known ? Json(held) : Json(nullptr)},
                 {"unknown", known ? Json(nullptr) : Json(f.kernel_unknown)},
                 {"mode", held && !v.holders.empty() ? Json(v.exclusive ? "exclusive" : "shared")
                          : tested_mode              ? Json(f.tested_exclusive ? "exclusive" : "shared")
                                                     : Json(nullptr)},
                 {"holder_pids", named},
                 {"fd_holder_pids", Json::array()},
                 {"tested_by_taking", f.tested_by_taking}};
  for (const auto& h : v.holders) {
    if (h.locked_by != 0) j["kernel"]["fd_holder_pids"].push_back(h.pid);
  }
  j["holder"] = holder_phrase(v);
  Json holders = Json::array();
  for (const auto& h : v.holders) {
    holders.push_back({{"pid", h.pid},
                       {"command", h.command.empty() ? Json(nullptr) : Json(h.command)},
                       {"mode", h.exclusive ? "exclusive" : "shared"},
                       {"locked_by", h.locked_by ? Json(h.locked_by) : Json(nullptr)},
                       {"uid", h.uid ? Json(*h.uid) : Json(nullptr)},
                       {"exited", h.exited}});
  }
  j["holders"] = std::move(holders);
  j["network_fs"] = f.network_fs ? Json(*f.network_fs) : Json(nullptr);
  Json waiters = Json::array();
  for (const auto& w : facts.waiters) {
    Json x = {{"pid", w.pid}, {"mode", w.exclusive ? "exclusive" : "shared"}, {"command", w.command}};
    x["agent_id"] = w.agent_id ? Json(*w.agent_id) : Json(nullptr);
    x["operation"] = w.operation ? Json(*w.operation) : Json(nullptr);
    x["waiting_at_most_ms"] = w.at_most_ms ? Json(*w.at_most_ms) : Json(nullptr);
    x["coalescing"] = w.coalescing;
    waiters.push_back(std::move(x));
  }
  j["waiters"] = f.holders_unlisted ? Json(nullptr) : std::move(waiters);  // null: the system cannot list them
  Json indexes = Json::array();
  for (const auto& x : facts.indexes) {
    indexes.push_back(
        {{"index", x.index},
         {"held", x.unknown ? Json(nullptr) : Json(x.held)},
         {"holder_pids", x.pids},
         {"holder", x.held ? Json(x.holder) : Json(nullptr)},
         {"record", x.record ? holder_to_json(*x.record) : Json(nullptr)},
         {"record_status", !x.record ? Json(nullptr)
                           : x.unknown  ? Json("unconfirmed")
                                        : Json(x.record_current ? "current" : "not the holder's")}});
  }
  j["holder_indexes"] = std::move(indexes);
  Json r = Json::object();
  r["state"] = !f.exists                                                         ? "missing"
               : f.refusal && !rec && f.record.state == HolderRead::State::Empty ? "not read"
                                                                                 : read_state_name(f.record.state);
  r["status"] = record_state_name(v.record);
  r["holder"] = rec ? holder_to_json(*rec) : Json(nullptr);
  r["released"] = rec ? Json(rec->released_at.has_value()) : Json(nullptr);
  r["age_ms"] = f.record_age_ms ? Json(*f.record_age_ms) : Json(nullptr);
  r["pid_alive"] = f.record_pid_alive ? Json(*f.record_pid_alive) : Json(nullptr);
  r["same_process"] = f.record_same_process ? Json(*f.record_same_process) : Json(nullptr);
  r["pid_note"] = f.record_pid_note.empty() ? Json(nullptr) : Json(f.record_pid_note);
  j["record"] = r;
  j["incidents"] = {{"count", facts.incidents.error ? Json(nullptr) : Json(facts.incidents.count)},
                    {"error", facts.incidents.error ? Json(std::strerror(facts.incidents.error)) : Json(nullptr)},
                    {"malformed", facts.incidents.malformed},
                    {"examined", facts.incidents.examined},
                    {"latest", facts.incidents.latest ? *facts.incidents.latest : Json(nullptr)},
                    {"recent", facts.incidents.recent}};
  Json runs = Json::array();
  for (const auto& e : facts.runs) runs.push_back(run_entry_to_json(e));
  j["runs"] = std::move(runs);
  j["runs_damaged"] = facts.runs_damaged;
  j["runs_error"] = facts.runs_error.empty() ? Json(nullptr) : Json(facts.runs_error);
  j["warnings"] = v.warnings;
  j["operator_action"] = v.action;
  return j;
}

// A hold across steps (--hold): its end and its tie; whether it has ended
// (released, or its holder gone: killed, its steps on).
std::string hold_text(const HolderRecord& rec, const Verdict& v) {
  const HoldFacts& h = *rec.hold;
  const bool ended = rec.released_at || v.record != RecordState::Current || !sys::process_alive(rec.pid);
  return std::string(ended ? "was a hold (looplock --hold)" : "a hold (looplock --hold)") + ": --max-time ends it at " +
         h.ends_at + (h.tied_to != 0 ? ", or the end of pid " + std::to_string(h.tied_to) + " it is tied to" : "") +
         (ended ? "" : "; a step runs inside it with its LOOPLOCK_HOLD, looplock --release ends it");
}

// --holders: how many index files are held, then each holder.

std::vector<std::pair<const char*, std::string>> index_lines(const std::vector<InspectFacts::Index>& indexes) {
  std::vector<std::pair<const char*, std::string>> out;
  if (indexes.empty()) return out;
  const auto held = std::count_if(indexes.begin(), indexes.end(), [](const auto& x) { return x.held; });
  const bool unknown = std::any_of(indexes.begin(), indexes.end(), [](const auto& x) { return x.unknown; });
  out.emplace_back("holders", unknown ? std::to_string(indexes.size()) +
                                            (indexes.size() == 1 ? " index file" : " index files") +
                                            " (--holders); which are held is unknown, as for the lock (kernel, above)"
                                      : std::to_string(held) + " of " + std::to_string(indexes.size()) +
                                            " index files held (--holders)");
  for (const auto& x : indexes) {
    if (!x.held) continue;
    std::string who = "index " + std::to_string(x.index) + ": " + x.holder;
    if (x.record && x.record_current && x.record->holders > 0)
      who += ", --holders " + std::to_string(x.record->holders);
    out.emplace_back("holder", who);
  }
  return out;
}

std::string report_text(const InspectFacts& facts, const Verdict& v) {
  const LockFacts& f = facts.lock;
  const bool held = v.state == LockState::Held;
  const bool known = f.kernel_unknown.empty();
  const HolderRecord* rec = v.read ? &*v.read : nullptr;
  const std::vector<Pid> named = kernel_named(v.holders);
  std::string t;
  auto line = [&](const char* label, const std::string& value) {
    char head[16];
    std::snprintf(head, sizeof head, "%-10s", label);
    t += head + printable(value) + "\n";
  };
  line("lock", f.lock_path + " (lock_id " + facts.lock_id + ")");
  if (!f.exists) {
    const bool creatable = std::none_of(facts.files.begin(), facts.files.end(),
                                        [&](const FileProblem& p) { return p.file == f.lock_path; });
    line("file", creatable ? "missing: the next run creates it" : "missing, and no run can create it (see the warning)");
  }
  const std::string tested = f.tested_by_taking   ? " (tested by taking it: the system names no holder or waiter)"
                             : f.holders_unlisted ? " (no lock file to hold; the system names no holder or waiter)"
                                                  : "";
  line("kernel", held && !named.empty()
                     ? std::string("held (") + (v.exclusive ? "exclusive" : "shared") + ") by " + pids_text(named)
                 : held && f.tested_by_taking
                     ? std::string("held (") + (f.tested_exclusive ? "exclusive" : "shared") + ")" + tested
                 : held  ? std::string("held")
                 : known ? "free" + tested
                         : "unknown (" + f.kernel_unknown + ")");
  line("holder", holder_phrase(v));
  if (rec) {
    line("record", record_state_text(v.record) + ": " + record_summary(*rec));
    std::string since = "acquired " + rec->acquired_at;
    if (f.record_age_ms) {
      since += *f.record_age_ms < 0
                   ? " (" + format_duration(-of_ms(*f.record_age_ms)) + " from now, by this host's clock)"
                   : " (" + ms_text(*f.record_age_ms) + " ago)";
    }
    line("", since + (rec->released_at ? ", released " + *rec->released_at
                                       : std::string(rec->no_fork ? ", not released (-F)" : ", not released")));
    if (!rec->released_at) line("process", process_text(f, *rec));
    if (rec->hold) line("hold", hold_text(*rec, v));
  } else {
    line("record", !f.exists                                         ? std::string("none")
                   : f.record.state == HolderRead::State::Unreadable ? std::string("unreadable")
                   : f.record.state == HolderRead::State::Error
                       ? "not read: " + std::string(std::strerror(f.record.err ? f.record.err : EIO))
                                                                     : std::string("none (the file is empty)"));
  }
  if (facts.waiters.empty()) line("waiting", known && !f.holders_unlisted ? "none" : "unknown");
  for (const auto& w : facts.waiters) {
    std::string who = "pid " + std::to_string(w.pid) + " (" + w.command;
    if (w.agent_id || w.operation) {
      who += ": agent " + w.agent_id.value_or("?") + ", operation " + w.operation.value_or("?");
    }
    who += std::string("), ") + (w.exclusive ? "exclusive" : "shared");
    if (w.at_most_ms) who += ", has waited at most " + ms_text(*w.at_most_ms);
    if (w.coalescing) who += "; coalescing: later -p coalesce runs of " + w.operation.value_or("?") + " skip";
    line("waiting", who);
  }
  for (const auto& [label, value] : index_lines(facts.indexes)) line(label, value);
  if (facts.incidents.error != 0) {
    line("incidents", "not read: " + std::string(std::strerror(facts.incidents.error)));
  } else if (facts.incidents.count == 0) {
    line("incidents", "none");
  } else {
    std::string inc = std::to_string(facts.incidents.count);
    if (facts.incidents.malformed) {
      inc += " (" + std::to_string(facts.incidents.malformed) + " malformed among the newest " +
             std::to_string(facts.incidents.examined) + ")";
    }
    if (const auto& l = facts.incidents.latest) inc += "; latest " + incident_text(*l);
    line("incidents", inc);
    // With --incidents N: the newest N rows, oldest first.
    if (facts.incidents.recent.size() > 1) {
      for (const auto& row : facts.incidents.recent) line("incident", incident_text(row));
    }
  }
  for (const auto& e : facts.runs) {
    const bool dead = std::find(facts.dead_runs.begin(), facts.dead_runs.end(), e.operation) != facts.dead_runs.end();
    line("last run", "operation " + e.operation + ": " + describe_run(e) +
                         (dead ? "; its looplock is dead (this host): the slot runs again at its next firing" : ""));
  }
  for (const auto& d : facts.runs_damaged) {
    line("last run", "operation " + d + ": a damaged entry (the next --once-per run of it rewrites it)");
  }
  if (!facts.runs_error.empty()) line("last run", "not read: " + facts.runs_error);
  for (const auto& w : v.warnings) line("warning", w);
  line("action", v.action);
  return t;
}

}  // namespace

std::optional<std::string> holders_disagree(const std::vector<InspectFacts::Index>& indexes) {
  std::vector<std::string> seen;
  int most = 0;
  std::set<int> ns;
  for (const auto& x : indexes) {
    if (!x.held || !x.record || !x.record_current || x.record->holders == 0) continue;
    ns.insert(x.record->holders);
    most = std::max(most, x.record->holders);
    seen.push_back("index " + std::to_string(x.index) + " by pid " + std::to_string(x.record->pid) +
                   " with --holders " + std::to_string(x.record->holders));
  }
  if (ns.size() < 2) return std::nullopt;
  return "the holders disagree on N (" + join(seen, "; ") + "): up to " + std::to_string(most) +
         " runs hold the lock at once, and a run with a smaller N waits while the indexes below it are taken. "
         "Give every run of this DIR the same --holders N";
}

InspectReport build_report(const InspectFacts& facts) {
  Verdict v = judge(facts.lock);
  for (const auto& f : facts.files) v.warnings.push_back(f.file + ": " + f.problem + ". " + f.fix);
  if (auto w = holders_disagree(facts.indexes)) v.warnings.push_back(*w);
  for (const auto& x : facts.indexes) {
    // A process the job left behind keeps the index (and no lock file):
    // one of the N places stays taken until it exits.
    const bool by_looplock =
        x.record_current && x.record && std::find(x.pids.begin(), x.pids.end(), x.record->pid) != x.pids.end();
    if (x.held && !by_looplock) {
      v.warnings.push_back(facts.lock.lock_path + ".holders." + std::to_string(x.index) + " is held by " + x.holder +
                           ", not by a looplock holder: one of the --holders places stays taken until " +
                           (x.pids.size() > 1 ? "they exit" : "it exits"));
    }
  }
  return {report_json(facts, v), report_text(facts, v)};
}

namespace {

// Whether looplock `pid`, waiting, sits in the seat of `operation`: the
// seat's record names it (its pid and start time).
bool in_seat(const LockDir& dir, Pid pid, const std::string& operation, bool shared) {
  const UniqueFd fd =
      sys::open_in(dir.fd.get(), coalesce_name(operation, shared), {.access = sys::OpenIn::Access::Read});
  if (!fd) return false;
  const auto text = sys::pread_all(fd.get(), 64 * 1024);
  const auto r = text ? seat_record(*text) : std::nullopt;
  // By pid and start time: the record holds the name clipped and as UTF-8.
  return r && r->pid == pid && r->pid_start == sys::process_start(pid).value_or("");
}

InspectFacts::Waiter describe_waiter(const sys::KernelLock& k, const LockDir& dir) {
  InspectFacts::Waiter w;
  w.pid = k.pid;
  w.exclusive = k.exclusive;
  w.command = sys::process_name(k.pid).value_or("?");
  w.at_most_ms = sys::process_age_ms(k.pid);
  if (w.command == "looplock" || w.command == "looplock-etcd") {
    // What it will record: its own command line read as looplock reads it
    // (only the agent and the operation come out of it: never an argument).
    if (auto argv = sys::process_args(k.pid)) {
      Environment env;
      env.looplock_agent = sys::process_env(k.pid, env_name::kAgent);
      env.user_name = [pid = k.pid] {
        auto uid = sys::process_uid(pid);
        return uid ? sys::user_name(*uid) : std::string("?");
      };
      if (auto id = looplock_identity(*argv, env)) {
        w.agent_id = clip_bytes(id->first);  // as its records will hold them
        w.operation = clip_bytes(id->second);
        w.coalescing = in_seat(dir, k.pid, id->second, !k.exclusive);  // the seat's name: the whole name's
      }
    }
  }
  return w;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> looplock_identity(const std::vector<std::string>& argv,
                                                                     const Environment& env) {
  try {
    Options o = parse_options(argv, env);
    if (o.mode != Mode::Run && o.mode != Mode::Hold) return std::nullopt;
    return std::make_pair(o.identity.agent, o.identity.operation);
  } catch (const Fatal&) {
    return std::nullopt;
  }
}

namespace {

// The part of a kind of lock besides the local one (--etcd's cluster lock),
// under its key in the JSON and its label in the text.
void add_part(const Options& o, const LockDir& dir, LockKind* kind, const Logger& log, InspectReport& report,
              int& status) {
  if (!kind) throw Fatal(exit_code::kOsError, "internal error: --inspect --etcd without the cluster lock");
  std::string canonical = canonical_lock_path(dir.fd.get(), dir.path);
  canonical.resize(canonical.size() - std::string_view(kLockName).size() - 1);
  InspectPart part = kind->inspect(o, canonical, log);
  if (part.status != 0) status = part.status;
  std::string label = kind->key();
  label.resize(std::max<size_t>(label.size() + 1, 10), ' ');
  for (const auto& l : part.lines) report.text += label + printable(l) + "\n";
  std::string warning = "warning";
  warning.resize(10, ' ');
  for (const auto& w : part.warnings) {
    report.text += warning + printable(w) + "\n";
    report.json["warnings"].push_back(w);
  }
  report.json[kind->key()] = std::move(part.json);
}

// Who holds each of --holders' index files (read only: opened for reading,
// never created or locked).
std::vector<InspectFacts::Index> survey_indexes(const LockDir& dir, const std::string& path,
                                                const std::string& kernel_unknown) {
  std::vector<InspectFacts::Index> out;
  for (const int k : indexes_in(dir)) {
    InspectFacts::Index x;
    x.index = k;
    const auto opened = open_index_to_read(dir, k);
    if (!opened) {
      out.push_back(x);  // judge_lock_files() says what is wrong with it
      continue;
    }
    const LockFile& file = *opened;
    const std::string name = index_name(k);
    const HolderRead read = read_holder(file.fd.get());
    x.record = read.record;
    const auto kernel = live_holders(file.st);
    x.held = !kernel.empty();
    // None listed where the kernel's list cannot show them all (a pid
    // namespace of our own, no /proc): unknown, never free.
    x.unknown = !x.held && !kernel_unknown.empty();
    if (x.held) {
      const Verdict v = judge(survey_held(file, sys::path_in_dir(path, name), kernel));
      for (const auto& h : v.holders) x.pids.push_back(h.pid);
      x.holder = holder_phrase(v);
      x.record_current = v.record == RecordState::Current;
    }
    out.push_back(std::move(x));
  }
  return out;
}

InspectReport inspect_dir(const Options& o, const std::string& path, LockKind* cluster, const Logger& log,
                          int& status) {
  LockDir dir = open_lock_dir(path, /*check_safety=*/false);
  InspectFacts f;
  f.lock_id = lock_id_for_path(canonical_lock_path(dir.fd.get(), path));
  std::vector<sys::KernelLock> waiters;
  f.lock = survey_lock(dir, sys::path_in_dir(path, kLockName), waiters);
  f.lock.stale_after_ms = ms_of(o.inspect.stale_after);
  for (const auto& k : waiters) f.waiters.push_back(describe_waiter(k, dir));
  f.incidents = summarize_incidents(dir.fd.get(), o.inspect.incidents);
  f.indexes = survey_indexes(dir, path, f.lock.kernel_unknown);
  try {
    LedgerRead runs = read_ledger(dir);
    f.runs = std::move(runs.entries);
    // A start without an end whose looplock is proven dead: the slot runs again.
    for (const auto& e : f.runs) {
      if (!e.ended_ms && runner_proven_dead(e)) f.dead_runs.push_back(e.operation);
    }
    f.runs_damaged = std::move(runs.damaged);
    if (runs.unreadable) f.runs_error = std::string(kRunsName) + " is not a run ledger (the next --once-per run rewrites it)";
  } catch (const Fatal& e) {
    f.runs_error = e.what();
  }
  f.files = judge_lock_files(dir, sys::own_euid());
  if (!o.metrics_dir.empty()) {
    auto metrics = judge_metrics_files(o.metrics_dir, f.lock_id, sys::own_euid());
    f.files.insert(f.files.end(), metrics.begin(), metrics.end());
  }

  InspectReport report = build_report(f);
  if (!o.cluster.etcd.empty()) add_part(o, dir, cluster, log, report, status);
  return report;
}

}  // namespace

int inspect(const Options& o, const Logger& log, LockKind* cluster) {
  const std::vector<std::string> dirs = o.inspect.dirs.empty() ? std::vector<std::string>{o.dir} : o.inspect.dirs;
  int status = exit_code::kOk;  // a DIR that could not be inspected (73, 66, 71), or etcd (69)
  bool warned = false;
  Json all = Json::array();
  std::string text;
  for (const auto& d : dirs) {
    try {
      InspectReport r = inspect_dir(o, d, cluster, log, status);
      warned = warned || !r.json["warnings"].empty();
      if (!text.empty()) text += "\n";
      text += r.text;
      all.push_back(std::move(r.json));
    } catch (const Fatal& e) {
      if (dirs.size() == 1 && !o.inspect.json) throw;
      log.error(e.event(), e.what(), e.hint());
      all.push_back(error_entry(d, e.status(), e.event(), e.what(), e.hint()));
      if (status == exit_code::kOk) status = e.status();
    }
  }
  if (o.inspect.json) {
    write_stdout(dump_json(dirs.size() == 1 ? all.at(0) : all) + "\n");
  } else {
    write_stdout(text);
  }
  if (status != exit_code::kOk) return status;
  return o.inspect.check && warned ? exit_code::kCheckWarned : exit_code::kOk;
}

}  // namespace looplock
