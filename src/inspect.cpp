#include "inspect.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "cluster.hpp"
#include "environment.hpp"
#include "error.hpp"
#include "etcd.hpp"
#include "exit_codes.hpp"
#include "lock_id.hpp"
#include "lockfile.hpp"
#include "sys.hpp"
#include "unique_fd.hpp"

namespace looplock {

std::optional<long long> parse_utc_ms(const std::string& iso) {
  // Exactly "YYYY-MM-DDTHH:MM:SS.mmmZ": fixed digits, no signs or spaces.
  static constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (iso.size() != kShape.size()) return std::nullopt;
  for (size_t i = 0; i < kShape.size(); ++i) {
    bool ok = kShape[i] == 'd' ? (iso[i] >= '0' && iso[i] <= '9') : iso[i] == kShape[i];
    if (!ok) return std::nullopt;
  }
  auto num = [&](size_t pos, size_t len) {
    int v = 0;
    for (size_t i = pos; i < pos + len; ++i) v = v * 10 + (iso[i] - '0');
    return v;
  };
  const int y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), s = num(17, 2),
            ms = num(20, 3);
  if (mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || s > 59) return std::nullopt;
  tm t{};
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = s;
  const time_t secs = timegm(&t);
  if (t.tm_mday != d || t.tm_mon != mo - 1) return std::nullopt;  // "11-31" was normalised to 12-01
  return static_cast<long long>(secs) * 1000 + ms;
}

std::string human_duration(long long ms) {
  char buf[64];
  if (ms < 0) ms = 0;
  if (ms < 1000) {
    std::snprintf(buf, sizeof buf, "%lldms", ms);
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%lld.%llds", ms / 1000, (ms / 100) % 10);  // truncated, never "60.0s"
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", ms / 60'000, (ms / 1000) % 60);
  } else if (ms < 86'400'000) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", ms / 3'600'000, (ms / 60'000) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", ms / 86'400'000, (ms / 3'600'000) % 24);
  }
  return buf;
}

namespace {

std::string pid_list(const std::vector<procfs::KernelLock>& kernel) {
  std::string out;
  for (const auto& k : kernel) {
    if (!out.empty()) out += ", ";
    out += std::to_string(k.pid);
  }
  return out;
}

const char* state_name(HolderRead::State s) {
  switch (s) {
    case HolderRead::State::Empty: return "empty";
    case HolderRead::State::Valid: return "valid";
    case HolderRead::State::Unreadable: return "unreadable";
    case HolderRead::State::Error: return "error";
  }
  return "error";
}

}  // namespace

InspectReport build_report(const InspectFacts& f) {
  std::vector<std::string> warnings;
  const bool held = !f.kernel.empty();
  bool exclusive = false;
  for (const auto& k : f.kernel) exclusive = exclusive || k.exclusive;
  const HolderRecord* rec = f.holder.record ? &*f.holder.record : nullptr;
  const bool claims = rec && !rec->released_at;  // the record says "held"
  auto kernel_has = [&](pid_t pid) {
    for (const auto& k : f.kernel)
      if (k.pid == pid) return true;
    return false;
  };

  if (f.network_fs) {
    warnings.push_back("the loop directory is on a network file system (" + *f.network_fs +
                       "): flock(2) there may not exclude processes on other hosts");
  }
  if (!f.dead_kernel_pids.empty()) {
    std::string dead, alive;
    for (pid_t p : f.dead_kernel_pids) dead += (dead.empty() ? "" : ", ") + std::to_string(p);
    for (pid_t p : f.fd_holders) alive += (alive.empty() ? "" : ", ") + std::to_string(p);
    warnings.push_back("the kernel names pid " + dead + ", which has exited: the lock is held through a descriptor it passed on" +
                       (alive.empty() ? std::string(" (the holding process could not be found: try fuser or lsof on the lock file)")
                                      : ", by pid " + alive) +
                       "; a background process started under looplock without -o/--close keeps the lock");
  }
  if (f.dir_unsafe) warnings.push_back("the loop directory is world-writable without the sticky bit: looplock refuses to lock it");
  if (f.not_regular) warnings.push_back("the lock path is " + *f.not_regular + ", not a regular file: looplock refuses to lock it");
  if (f.holder.state == HolderRead::State::Unreadable) {
    warnings.push_back("the lock file holds " + std::to_string(f.holder.size) +
                       " bytes that are not a valid holder record (garbage, or a writer from another tool)");
  }
  const bool known = f.kernel_unknown.empty();
  if (!known) warnings.push_back("the kernel's view is unknown: " + f.kernel_unknown);
  if (claims && !held && known) {
    warnings.push_back("the record says pid " + std::to_string(rec->pid) +
                       " holds the lock, but the kernel says it is free: the holder crashed or was killed before "
                       "releasing; the next run overwrites the record");
  }
  if (claims && f.pid_alive && !*f.pid_alive) {
    warnings.push_back("the record's pid " + std::to_string(rec->pid) + " is dead");
  } else if (claims && f.same_process && !*f.same_process) {
    warnings.push_back("the record's pid " + std::to_string(rec->pid) +
                       " now belongs to another process (pid reused): the recorded holder is gone");
  }
  if (held && claims && !kernel_has(rec->pid)) {
    warnings.push_back("the kernel says pid " + pid_list(f.kernel) + " holds the lock, not the record's pid " +
                       std::to_string(rec->pid));
  }
  if (held && !claims && exclusive && f.dead_kernel_pids.empty()) {
    warnings.push_back("held by pid " + pid_list(f.kernel) +
                       " without a current holder record (flock(1), Python fcntl.flock or another tool)");
  }
  if (held && claims && f.age_ms && *f.age_ms > f.stale_after_ms) {
    warnings.push_back("held for " + human_duration(*f.age_ms) + ", longer than --stale-after " +
                       human_duration(f.stale_after_ms) + ": check whether pid " + std::to_string(rec->pid) +
                       " is stalled before terminating it");
  }

  std::string action;
  if (!held && !known) {
    action = "unknown: looplock cannot see whether the lock is held (" + f.kernel_unknown +
             "); look from where the holder is visible (the host, another pid namespace), or with fuser or lsof on "
             "the lock file. Never delete the lock file.";
  } else if (!held) {
    action = "none: the lock is free";
  } else {
    std::string who = claims && kernel_has(rec->pid) ? std::to_string(rec->pid) : pid_list(f.kernel);
    if (!f.fd_holders.empty()) {
      who.clear();
      for (pid_t p : f.fd_holders) who += (who.empty() ? "" : ", ") + std::to_string(p);
    }
    action = "if the holder is stuck: confirm that pid " + who +
             " is alive and stalled (ps, strace) before terminating it; the kernel frees the lock when it exits. "
             "Never delete the lock file.";
  }

  Json j = Json::object();
  j["lock_file"] = f.lock_path;
  j["lock_id"] = f.lock_id;
  j["exists"] = f.exists;
  j["kernel"] = {{"held", held || known ? Json(held) : Json(nullptr)},
                 {"unknown", known ? Json(nullptr) : Json(f.kernel_unknown)},
                 {"mode", held ? Json(exclusive ? "exclusive" : "shared") : Json(nullptr)},
                 {"holder_pids", Json::array()},
                 {"fd_holder_pids", f.fd_holders}};
  for (const auto& k : f.kernel) j["kernel"]["holder_pids"].push_back(k.pid);
  j["network_fs"] = f.network_fs ? Json(*f.network_fs) : Json(nullptr);
  Json waiters = Json::array();
  for (const auto& w : f.waiters) {
    Json x = {{"pid", w.pid}, {"mode", w.exclusive ? "exclusive" : "shared"}, {"command", w.command}};
    x["agent_id"] = w.agent_id ? Json(*w.agent_id) : Json(nullptr);
    x["operation"] = w.operation ? Json(*w.operation) : Json(nullptr);
    x["waiting_at_most_ms"] = w.at_most_ms ? Json(*w.at_most_ms) : Json(nullptr);
    waiters.push_back(std::move(x));
  }
  j["waiters"] = std::move(waiters);
  Json r = Json::object();
  r["state"] = !f.exists ? "missing" : f.not_regular ? "not read" : state_name(f.holder.state);
  r["holder"] = rec ? holder_to_json(*rec) : Json(nullptr);
  r["released"] = rec ? Json(rec->released_at.has_value()) : Json(nullptr);
  r["age_ms"] = f.age_ms ? Json(*f.age_ms) : Json(nullptr);
  r["pid_alive"] = f.pid_alive ? Json(*f.pid_alive) : Json(nullptr);
  r["same_process"] = f.same_process ? Json(*f.same_process) : Json(nullptr);
  r["pid_note"] = f.pid_note.empty() ? Json(nullptr) : Json(f.pid_note);
  j["record"] = r;
  j["incidents"] = {{"count", f.incidents.count},
                    {"malformed", f.incidents.malformed},
                    {"latest", f.incidents.latest ? *f.incidents.latest : Json(nullptr)}};
  j["warnings"] = warnings;
  j["operator_action"] = action;

  std::string t;
  auto line = [&](const char* label, const std::string& value) {
    char head[16];
    std::snprintf(head, sizeof head, "%-10s", label);
    t += head + printable(value) + "\n";
  };
  line("lock", f.lock_path + " (lock_id " + f.lock_id + ")");
  if (!f.exists) {
    line("file", "missing: no looplock has run here yet");
  }
  line("kernel", held    ? std::string("held (") + (exclusive ? "exclusive" : "shared") + ") by pid " + pid_list(f.kernel)
                : known ? std::string("free")
                        : "unknown (" + f.kernel_unknown + ")");
  if (rec) {
    line("holder", "pid " + std::to_string(rec->pid) + ", agent " + rec->agent_id + ", operation " + rec->operation +
                       ", policy " + rec->policy);
    std::string since = "acquired " + rec->acquired_at;
    if (f.age_ms) since += " (" + human_duration(*f.age_ms) + " ago)";
    since += rec->released_at ? ", released " + *rec->released_at : std::string(", not released");
    line("", since);
    if (!rec->released_at) {
      std::string proc = !f.pid_alive              ? "unknown"
                         : !*f.pid_alive           ? "dead"
                         : !f.same_process         ? "alive (its start time cannot be compared)"
                         : !*f.same_process        ? "pid reused by another process"
                                                   : "alive, same process";
      if (!f.pid_note.empty()) proc += ", " + f.pid_note;
      line("process", proc + " (pid_start " + (rec->pid_start.empty() ? std::string("unknown") : rec->pid_start) + ")");
    }
  } else {
    line("holder", !f.exists       ? std::string("no record")
                   : f.not_regular ? std::string("not read (not a regular file)")
                                   : std::string("no record (") + state_name(f.holder.state) + ")");
  }
  if (f.waiters.empty()) {
    line("waiting", known ? "none" : "unknown");
  }
  for (const auto& w : f.waiters) {
    std::string who = "pid " + std::to_string(w.pid) + " (" + w.command;
    if (w.agent_id || w.operation) {
      who += ": agent " + w.agent_id.value_or("?") + ", operation " + w.operation.value_or("?");
    }
    who += std::string("), ") + (w.exclusive ? "exclusive" : "shared");
    if (w.at_most_ms) who += ", for at most " + human_duration(*w.at_most_ms);
    line("waiting", who);
  }
  if (f.incidents.count == 0) {
    line("incidents", "none");
  } else {
    std::string inc = std::to_string(f.incidents.count);
    if (f.incidents.malformed) inc += " (" + std::to_string(f.incidents.malformed) + " malformed)";
    if (const auto& l = f.incidents.latest) {
      inc += "; latest " + l->value("at", std::string("?")) + " " + l->value("error_code", std::string("?")) +
             ": waiter pid " + std::to_string(l->at("waiter").value("pid", 0)) + " (" +
             l->at("waiter").value("operation", std::string("?")) + ") waited " +
             human_duration(l->value("waited_ms", 0LL));
    }
    line("incidents", inc);
  }
  for (const auto& w : warnings) line("warning", w);
  line("action", action);
  return {std::move(j), std::move(t)};
}

namespace {

// Whether this process is in a pid namespace other than the initial one:
// there /proc/locks (of its own /proc) does not list a lock held from outside.
bool in_child_pid_namespace() {
  char buf[64];
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  if (n <= 0) return false;  // cannot tell: assume the usual
  return std::string_view(buf, static_cast<size_t>(n)) != "pid:[4026531836]";  // PROC_PID_INIT_INO
}

InspectFacts::Waiter describe_waiter(const procfs::KernelLock& k) {
  InspectFacts::Waiter w;
  w.pid = k.pid;
  w.exclusive = k.exclusive;
  w.command = procfs::comm(k.pid).value_or("?");
  w.at_most_ms = procfs::age_ms(k.pid);
  if (w.command == "looplock" || w.command == "looplock-etcd") {
    // What it will record: its own command line read as looplock reads it
    // (only the agent and the operation come out of it: never an argument).
    if (auto argv = procfs::cmdline(k.pid)) {
      Environment env;
      env.looplock_agent = procfs::environ_get(k.pid, env_name::kAgent);
      env.user_name = [pid = k.pid] {
        auto uid = procfs::real_uid(pid);
        return uid ? sys::user_name(*uid) : std::string("?");
      };
      if (auto id = looplock_identity(*argv, env)) {
        w.agent_id = id->first;
        w.operation = id->second;
      }
    }
  }
  return w;
}

void gather_kernel(InspectFacts& f, const struct stat& st) {
  errno = 0;
  auto table = procfs::lock_table(st);
  if (!table) {
    f.kernel_unknown = errno_message("cannot read /proc/locks", errno ? errno : EIO);
    return;
  }
  for (const auto& k : table->waiters) f.waiters.push_back(describe_waiter(k));
  f.kernel = table->holders;
  if (f.kernel.empty()) {
    if (in_child_pid_namespace() && procfs::ns_pids(0).size() <= 1) {
      f.kernel_unknown = "no holder is listed, but this runs in a pid namespace of its own, whose /proc/locks does "
                         "not list a holder outside it";
    }
    return;
  }
  for (const auto& k : f.kernel) {
    if (!procfs::pid_alive(k.pid)) f.dead_kernel_pids.push_back(k.pid);
  }
  if (!f.dead_kernel_pids.empty()) f.fd_holders = procfs::pids_holding_flock(procfs::all_pids(), st);
}

// Whether the record's pid is alive, is the process that wrote it, and how
// it is seen from here: a holder that wrote its record inside a pid namespace
// of its own appears here under another pid (NSpid), with the same start
// time.
void gather_record_process(InspectFacts& f, const HolderRecord& rec) {
  for (const auto& k : f.kernel) {
    if (k.pid == rec.pid) continue;
    auto nspids = procfs::ns_pids(k.pid);
    if (nspids.size() > 1 && std::find(nspids.begin() + 1, nspids.end(), rec.pid) != nspids.end()) {
      auto start = procfs::pid_start(k.pid);
      if (!rec.pid_start.empty() && start && *start == rec.pid_start) {
        f.pid_alive = true;
        f.same_process = true;
        f.pid_note = "pid " + std::to_string(rec.pid) + " in its own pid namespace, pid " + std::to_string(k.pid) +
                     " here";
        return;
      }
    }
  }
  f.pid_alive = procfs::pid_alive(rec.pid);
  if (!*f.pid_alive) {
    if (in_child_pid_namespace()) {
      f.pid_alive.reset();
      f.pid_note = "not visible from this pid namespace (the record may come from outside it)";
    }
    return;
  }
  auto start = procfs::pid_start(rec.pid);
  if (start && !rec.pid_start.empty()) f.same_process = *start == rec.pid_start;
  if (!f.same_process) f.pid_note = rec.pid_start.empty() ? "no start time was recorded" : "its start time cannot be read";
}

}  // namespace

std::optional<std::pair<std::string, std::string>> looplock_identity(const std::vector<std::string>& argv,
                                                                     const Environment& env) {
  try {
    Options o = parse_options(argv, env);
    if (o.mode != Mode::Run) return std::nullopt;
    return std::make_pair(o.agent, o.operation);
  } catch (const Fatal&) {
    return std::nullopt;
  }
}

namespace {

// The cluster lock too (--etcd): who holds it, who waits, in the order they
// take it; read only.
void inspect_cluster(const Options& o, const LockDir& dir, etcd::Transport* etcd, const Logger& log,
                     InspectReport& report, int& status) {
  std::string canonical = canonical_lock_path(dir.fd.get(), dir.path);
  canonical.resize(canonical.size() - std::string_view(kLockName).size() - 1);
  const std::string name = cluster_lock_name(o.lock_name, canonical);
  if (!etcd) throw Fatal(exit_code::kOsError, "internal error: --inspect --etcd without an HTTP client");
  const ClusterAccess access = cluster_access(o, log);
  etcd->configure(access.tls);
  etcd::Client client(*etcd, etcd::parse_endpoints(o.etcd).endpoints);
  if (!access.user.empty()) client.set_credentials(access.user, access.password);
  const long long deadline = sys::monotonic_ns() + 5'000'000'000LL;
  const etcd::Deadline bound{deadline, 1'000'000'000LL};
  // The contenders in the order they take the lock: the first holds it. An
  // encoded name's are read under the unencoded prefix too (earlier
  // versions, etcdctl lock).
  const std::vector<std::string> prefixes = etcd::contender_prefixes(name);
  std::vector<etcd::RangeResult> reads;
  std::string error;
  for (const auto& p : prefixes) {
    auto keys = client.range({p, true, 0, etcd::RangeQuery::Order::FirstCreated, 0}, bound);
    if (!keys.ok()) {
      error = keys.error;
      break;
    }
    reads.push_back(std::move(keys.value));
  }
  // The key too when the contender is on the unencoded prefix of an encoded
  // name (an earlier looplock, etcdctl lock) or wrote no value.
  auto key_note = [&](const std::optional<Json>& value, const etcd::KeyValue& kv) {
    return !value || !etcd::is_contender_key(prefixes.front(), kv.key) ? ", key " + kv.key : std::string();
  };
  Json c = {{"lock_name", name}};
  std::vector<std::string> lines;
  if (!error.empty()) {
    c["error"] = error;
    lines.push_back("cannot read from etcd: " + error);
    status = exit_code::kClusterUnavailable;
  } else {
    const auto kvs = etcd::contenders(prefixes, reads);
    std::optional<Json> holder;
    if (!kvs.empty()) {
      holder = parse_cluster_holder(kvs.front().value);
      if (!holder && etcd::is_contender_key(etcd::legacy_lock_prefix(name), kvs.front().key)) {
        // An earlier looplock (etcd's lock service) kept its value beside the prefix.
        auto h = client.range({etcd::holder_key(name)}, bound);
        if (h.ok() && !h.value.kvs.empty()) holder = parse_cluster_holder(h.value.kvs.front().value);
      }
      if (holder) {
        (*holder)["fencing_token"] = kvs.front().create_revision;
        (*holder)["key"] = kvs.front().key;
      }
    }
    Json waiting = Json::array();
    for (size_t i = 1; i < kvs.size(); ++i) {
      std::optional<Json> value = parse_cluster_holder(kvs[i].value);
      Json w = value.value_or(Json::object());
      // A waiter's value says when it queued, not an acquisition.
      if (w.contains("acquired_at")) {
        w["queued_at"] = w["acquired_at"];
        w.erase("acquired_at");
      }
      w["key"] = kvs[i].key;
      const std::optional<Json> shown = value ? std::optional<Json>(w) : std::nullopt;
      lines.push_back("waiting " + std::to_string(i) + ": " + describe_cluster_waiter(shown) + key_note(value, kvs[i]));
      waiting.push_back(std::move(w));
    }
    c["held"] = !kvs.empty();
    c["contenders"] = kvs.size();
    c["holder"] = holder ? *holder : Json(nullptr);
    c["waiting"] = waiting;
    if (kvs.empty()) {
      lines.insert(lines.begin(), "free (lock name " + name + ")");
    } else {
      lines.insert(lines.begin(), "held by " + describe_cluster_holder(holder) + key_note(holder, kvs.front()) +
                                      ", fencing token " + std::to_string(kvs.front().create_revision) +
                                      " (lock name " + name + ")");
      if (kvs.size() == 1) lines.push_back("waiting none");
    }
  }
  report.json["cluster"] = c;
  for (const auto& l : lines) report.text += "cluster   " + printable(l) + "\n";
}

InspectReport inspect_dir(const Options& o, const std::string& path, etcd::Transport* etcd, const Logger& log,
                          int& status) {
  LockDir dir = open_lock_dir(path, /*check_safety=*/false);
  InspectFacts f;
  f.lock_path = path + (path.ends_with('/') ? "" : "/") + kLockName;
  f.lock_id = lock_id_for_path(canonical_lock_path(dir.fd.get(), path));
  f.dir_unsafe = dir_mode_unsafe(dir.st.st_mode);
  f.stale_after_ms = o.stale_after_ns / 1'000'000;
  f.network_fs = network_file_system(dir.fd.get());

  struct stat st {};
  if (fstatat(dir.fd.get(), kLockName, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    f.exists = true;
    if (!S_ISREG(st.st_mode)) {
      f.not_regular = S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "a special file";
    } else {
      UniqueFd fd(sys::retry_eintr(
          [&] { return openat(dir.fd.get(), kLockName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
      if (fd) {
        fstat(fd.get(), &st);
        f.holder = read_holder(fd.get());
      } else {
        f.holder.state = HolderRead::State::Error;
      }
      gather_kernel(f, st);
    }
  } else if (errno != ENOENT) {
    fail_errno(exit_code::kOsError, "cannot stat " + f.lock_path, errno);
  }
  if (const auto& rec = f.holder.record) {
    if (auto at = parse_utc_ms(rec->acquired_at)) f.age_ms = sys::realtime_ms() - *at;
    gather_record_process(f, *rec);
  }
  f.incidents = summarize_incidents(dir.fd.get());

  InspectReport report = build_report(f);
  if (!o.etcd.empty()) inspect_cluster(o, dir, etcd, log, report, status);
  return report;
}

}  // namespace

int inspect(const Options& o, const Logger& log, etcd::Transport* etcd) {
  const std::vector<std::string> dirs = o.dirs.empty() ? std::vector<std::string>{o.dir} : o.dirs;
  int status = exit_code::kOk;  // a DIR that could not be inspected (66, 71), or etcd (69)
  bool warned = false;
  Json all = Json::array();
  std::string text;
  for (const auto& d : dirs) {
    try {
      InspectReport r = inspect_dir(o, d, etcd, log, status);
      warned = warned || !r.json["warnings"].empty();
      if (!text.empty()) text += "\n";
      text += r.text;
      all.push_back(std::move(r.json));
    } catch (const Fatal& e) {
      if (dirs.size() == 1) throw;
      log.error(e.event(), e.what(), e.hint());
      if (status == exit_code::kOk) status = e.status();
    }
  }
  if (o.json) {
    write_stdout(dump_json(dirs.size() == 1 ? all.at(0) : all) + "\n");
  } else {
    write_stdout(text);
  }
  if (status != exit_code::kOk) return status;
  return o.check && warned ? exit_code::kCheckWarned : exit_code::kOk;
}

}  // namespace looplock
