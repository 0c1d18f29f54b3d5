#include "records/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "base/duration.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "os/clock.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"

namespace looplock {

namespace {

constexpr size_t kMaxFileBytes = 4 << 20;
// The modes files are created with, before the umask (never changed
// afterwards): what node_exporter reads (the file, its staging file, a
// temporary) 0664, so that the collector, another user, can read it and a
// group that shares the directory can write it; the lock that serialises
// updates 0660, as the lock file: whoever can open it can hold it.
constexpr unsigned kCollectedMode = 0664;
constexpr unsigned kUpdateLockMode = 0660;
// How long a run waits for the other runs' updates of the same file.
constexpr Duration kLockWait = std::chrono::seconds(5);

struct Gauge {
  const char* name;
  const char* help;
  double OperationSeries::*field;
  bool timestamp;
};
constexpr Gauge kGauges[] = {
    {"looplock_last_start_timestamp_seconds", "When the last run started (Unix time).", &OperationSeries::last_start,
     true},
    {"looplock_last_success_timestamp_seconds",
     "When the last run whose command exited 0 ended (Unix time; 0 before the first).", &OperationSeries::last_success,
     true},
    {"looplock_last_exit_status", "The exit status of the last run (128+N when its command was killed by signal N).",
     &OperationSeries::last_exit_status, false},
    {"looplock_last_duration_seconds", "How long the last run's command ran (0 when it did not run).",
     &OperationSeries::last_duration, false},
    {"looplock_last_wait_seconds", "How long the last run waited for the lock.", &OperationSeries::last_wait, false},
};
constexpr const char* kRunsName = "looplock_runs_total";

// snprintf(3), not std::to_chars: the run has used snprintf already, and
// to_chars' code lies elsewhere in the executable (first touches cost a
// page fault each).
std::string number(double v, bool timestamp) {
  char buf[64];
  if (timestamp) {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  } else if (v == static_cast<double>(static_cast<long long>(v))) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof buf, "%.6f", v);
  }
  return buf;
}

std::string labels(const MetricsFile& f, const std::string& operation) {
  return "lock_id=\"" + label_value(f.lock_id) + "\",loop=\"" + label_value(f.loop) + "\",operation=\"" +
         label_value(operation) + "\"";
}

std::optional<RunOutcome> outcome_from(std::string_view name) {
  for (RunOutcome o : kAllOutcomes) {
    if (outcome_name(o) == name) return o;
  }
  return std::nullopt;
}

// One sample line: NAME{K="V",...} VALUE, with the labels looplock writes
// (the others are passed over). nullopt when it is not one.
struct Sample {
  std::string_view name;
  std::optional<std::string> lock_id, loop, operation, outcome;
  double value = 0;
};

// A label's value from its escaped text (\\, \" and \n).
std::string unescape(std::string_view escaped) {
  if (escaped.find('\\') == std::string_view::npos) return std::string(escaped);
  std::string value;
  for (size_t j = 0; j < escaped.size(); ++j) {
    if (escaped[j] == '\\' && j + 1 < escaped.size()) {
      ++j;
      value += escaped[j] == 'n' ? '\n' : escaped[j];
    } else {
      value += escaped[j];
    }
  }
  return value;
}

std::optional<Sample> parse_sample(std::string_view line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) ++i;
  if (i == 0) return std::nullopt;
  s.name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
      const std::string_view key = line.substr(i, eq - i);
      size_t j = eq + 2;
      while (j < line.size() && line[j] != '"') j += line[j] == '\\' && j + 1 < line.size() ? 2 : 1;
      if (j >= line.size()) return std::nullopt;
      const std::string_view escaped = line.substr(eq + 2, j - eq - 2);
      using namespace std::string_view_literals;
      std::optional<std::string>* field = key == "operation"sv ? &s.operation
                                          : key == "outcome"sv ? &s.outcome
                                          : key == "lock_id"sv ? &s.lock_id
                                          : key == "loop"sv    ? &s.loop
                                                               : nullptr;
      if (field) *field = unescape(escaped);
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  const std::string_view text = line.substr(i);
  char buf[64];
  if (text.empty() || text.size() >= sizeof buf) return std::nullopt;
  text.copy(buf, text.size());
  buf[text.size()] = '\0';
  char* end = nullptr;
  errno = 0;
  s.value = std::strtod(buf, &end);
  if (errno != 0 || end == buf || (*end != '\0' && *end != ' ')) return std::nullopt;
  return s;
}



}  // namespace

std::string label_value(std::string_view raw) {
  std::string out;
  for (char c : utf8_text(raw, kMaxIdentityBytes)) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string render_metrics(const MetricsFile& f) {
  std::map<std::string, std::string> label_of;  // by operation, escaped once
  for (const auto& [op, series] : f.operations) label_of.emplace(op, labels(f, op));
  std::string out;
  out.reserve(1024 + f.operations.size() * 1536);
  out += "# HELP looplock_runs_total Runs of looplock on this lock, by how they ended.\n";
  out += "# TYPE looplock_runs_total counter\n";
  for (const auto& [op, series] : f.operations) {
    for (RunOutcome o : kAllOutcomes) {
      auto it = series.runs.find(o);
      out.append(kRunsName).append("{").append(label_of.at(op)).append(",outcome=\"").append(outcome_name(o));
      out.append("\"} ").append(number(it == series.runs.end() ? 0 : it->second, false)).append("\n");
    }
  }
  for (const auto& g : kGauges) {
    out.append("# HELP ").append(g.name).append(" ").append(g.help).append("\n");
    out.append("# TYPE ").append(g.name).append(" gauge\n");
    for (const auto& [op, series] : f.operations) {
      out.append(g.name).append("{").append(label_of.at(op)).append("} ");
      out.append(number(series.*g.field, g.timestamp)).append("\n");
    }
  }
  return out;
}

MetricsFile parse_metrics(std::string_view text) {
  MetricsFile f;
  sys::for_each_line(text, [&](std::string_view line) {
    if (line.empty() || line.front() == '#') return;
    auto s = parse_sample(line);
    if (!s || !s->operation) return;
    if (f.lock_id.empty()) f.lock_id = s->lock_id.value_or("");
    if (f.loop.empty()) f.loop = s->loop.value_or("");
    OperationSeries& series = f.operations[*s->operation];
    if (s->name == kRunsName) {
      if (auto o = outcome_from(s->outcome.value_or(""))) series.runs[*o] = s->value;
      return;
    }
    for (const auto& g : kGauges) {
      if (s->name == g.name) series.*g.field = s->value;
    }
  });
  return f;
}

void add_run(MetricsFile& f, const RunMetrics& run) {
  f.lock_id = run.lock_id;
  f.loop = run.loop;
  // By the operation as its label says it (what parse_metrics reads back):
  // names that differ only beyond 256 bytes or in bytes that are not UTF-8
  // share one series, never two of the same labels.
  OperationSeries& s = f.operations[utf8_text(run.operation, kMaxIdentityBytes)];
  s.runs[run.outcome] += 1;
  s.last_start = run.start_s;
  if (run.outcome == RunOutcome::Success) s.last_success = run.end_s;
  s.last_exit_status = run.exit_status;
  s.last_duration = run.duration_s;
  s.last_wait = run.wait_s;
}

namespace {

// What failed, with errno.
sys::Failure failed(const std::string& what) {
  const int err = errno;
  std::string hint;
  if (err == EACCES && !sys::abilities().advisory_locks) {
    // Windows: access is by ACL, and a reader that does not share delete
    // (a scraper, a virus scanner) blocks the replacing rename.
    hint =
        "another process kept the file open without sharing delete, past looplock's retries (a scraper or a "
        "scanner), or the directory's ACL denies it; the next run writes the file whole again";
  } else if (err == EACCES) {
    hint =
        "a directory a group shares: its files are created group-writable under umask 002; their owner or root "
        "lets the group read and write those made before: chmod g+rw";
  }
  return {.what = what, .err = err, .hint = hint};
}

// Where the collector's file is replaced: DIR's descriptor, the file's name,
// and DIR as given (for messages).
struct Place {
  int dirfd;
  const std::string& name;
  const std::string& dir;
};

// The kept staging file, DIR/.looplock_<lock_id>.prom.next: written in
// place, then swapped with the collector's file by one
// renameat2(RENAME_EXCHANGE), so that no inode is created or freed (on ext4
// each is a journal transaction: most of what a metrics update cost). The
// inode it writes into was the collector's file until the last swap; a
// reader may still have it open, and must never see it rewritten under it:
// a write lease (F_SETLEASE F_WRLCK), which the kernel grants only when no
// other descriptor has the file open, proves nobody does; it is held until
// the file is in place (closing the descriptor drops it), so that an open
// that was under way blocks until then, and reads the whole new file.
// Returns true once the file is in place (`err` none) or when a write
// failed (`err` says why); false when the staging file cannot be used here
// (another user's, no leases on this file system, a reader holds it, no
// RENAME_EXCHANGE): the caller replaces the file the old way.
bool swap_in(const Place& at, const std::string& text, std::optional<sys::Failure>& err) {
  const std::string staging = "." + at.name + ".next";
  const UniqueFd fd = sys::open_in(at.dirfd, staging,
                                   {.access = sys::OpenIn::Access::ReadWrite,
                                    .create = sys::OpenIn::Create::IfMissing,
                                    .mode = kCollectedMode});
  sys::FileStatus st;
  if (!fd || !sys::status_of_fd(fd.get(), st) || !st.regular() || st.links != 1) return false;
  if (!sys::exclusive_write_lease(fd.get())) return false;
  if (!sys::pwrite_all(fd.get(), text)) {
    err = failed("cannot write " + sys::path_in_dir(at.dir, staging));
    return true;
  }
  if (static_cast<size_t>(st.size) > text.size() &&
      !sys::truncate_fd(fd.get(), static_cast<long long>(text.size()))) {
    err = failed("cannot write " + sys::path_in_dir(at.dir, staging));
    return true;
  }
  if (sys::exchange_in(at.dirfd, staging, at.name)) return true;
  if (errno == EINVAL || errno == ENOSYS) return false;  // no RENAME_EXCHANGE here
  // No collector's file yet (the first run, or it was deleted): the staging
  // file becomes it, and the next run makes a new one.
  if (errno == ENOENT && sys::rename_in(at.dirfd, staging, at.name)) return true;
  err = failed("cannot rename " + staging + " to " + sys::path_in_dir(at.dir, at.name));
  return true;
}

// The file replaced by a new one: a temporary file of this process's own,
// written, then renamed over it. Once created, it is removed on every
// failure, whichever step failed (the warning names that step), so that a
// full disk leaves nothing behind. One that an earlier run with this pid
// left (ended mid-update) is removed first: the update lock is held, so no
// other run writes it.
std::optional<sys::Failure> replace_by_rename(const Place& at, const std::string& text) {
  const std::string tmp = "." + at.name + "." + std::to_string(sys::own_pid()) + ".tmp";
  const std::string shown = sys::path_in_dir(at.dir, tmp);
  (void)sys::remove_in(at.dirfd, tmp);
  UniqueFd out =
      sys::open_in(at.dirfd, tmp,
                   {.access = sys::OpenIn::Access::Write, .create = sys::OpenIn::Create::New, .mode = kCollectedMode});
  std::optional<sys::Failure> err;
  if (!out) {
    err = failed("cannot create " + shown);
  } else if (!sys::write_all(out.get(), text)) {
    err = failed("cannot write " + shown);
  } else if (!sys::close_checked(std::move(out))) {
    err = failed("cannot write " + shown);
  } else if (!sys::rename_in(at.dirfd, tmp, at.name)) {
    err = failed("cannot rename " + tmp + " to " + sys::path_in_dir(at.dir, at.name));
  }
  if (err) {
    out.reset();  // closed first: Windows keeps an open file's name until it is closed
    // Also after a failed create: an open can fail once the file is made
    // (wine's, when the disk is full); whatever is at this name is ours.
    (void)sys::remove_in(at.dirfd, tmp);
  }
  return err;
}

}  // namespace

std::string metrics_file_name(const std::string& lock_id) { return "looplock_" + lock_id + ".prom"; }

std::optional<sys::Failure> update_metrics_file(const std::string& dir, const RunMetrics& run) {
  const UniqueFd dirfd = sys::open_directory(dir);
  if (!dirfd) return failed("cannot open the metrics directory " + dir);
  const std::string name = metrics_file_name(run.lock_id);

  // One update at a time, so that counters carry over without losing any.
  // flock(2) needs only a read descriptor: a lock file another member of
  // the group made without group write (0644, as earlier versions did) is
  // opened read-only.
  const std::string lock_name = "." + name + ".lock";
  sys::OpenIn how{.access = sys::OpenIn::Access::ReadWrite,
                  .create = sys::OpenIn::Create::IfMissing,
                  .mode = kUpdateLockMode};
  UniqueFd lock = sys::open_in(dirfd.get(), lock_name, how);
  if (!lock && errno == EACCES) lock = sys::open_in(dirfd.get(), lock_name, {.access = sys::OpenIn::Access::Read});
  if (!lock) return failed("cannot open " + sys::path_in_dir(dir, lock_name));
  const Instant give_up = MonotonicClock::now() + kLockWait;
  while (!sys::try_lock(lock.get(), /*exclusive=*/true)) {
    if (errno != EWOULDBLOCK) return failed("cannot lock " + sys::path_in_dir(dir, lock_name));
    if (MonotonicClock::now() >= give_up) {
      return sys::Failure{.what = "the metrics file " + sys::path_in_dir(dir, name) + " stayed busy for " +
                                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kLockWait).count()) +
                                  " s"};
    }
    nap(std::chrono::milliseconds(1));
  }

  MetricsFile f;
  {
    // Closed before the file is replaced: Windows replaces no file that is
    // open, not even by its own process.
    const UniqueFd old = sys::open_in(dirfd.get(), name, {.access = sys::OpenIn::Access::Read});
    // One that is there but cannot be read (another member made it under
    // umask 077) is left as it is: a file without its counters would lose
    // every one of them.
    if (!old && errno != ENOENT) {
      return failed("cannot read " + sys::path_in_dir(dir, name) +
                    ", so it was not updated (its counters would be lost)");
    }
    if (old) {
      const auto text = sys::pread_all(old.get(), kMaxFileBytes);
      if (!text) return failed("cannot read " + sys::path_in_dir(dir, name) + ", so it was not updated");
      f = parse_metrics(*text);
    }
  }
  add_run(f, run);
  const std::string text = render_metrics(f);
  const Place at{dirfd.get(), name, dir};
  std::optional<sys::Failure> err;
  if (swap_in(at, text, err)) return err;
  return replace_by_rename(at, text);
}

}  // namespace looplock
