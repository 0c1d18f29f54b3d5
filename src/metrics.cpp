#include "metrics.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "holder.hpp"
#include "log.hpp"
#include "sys.hpp"
#include "unique_fd.hpp"

namespace looplock {

namespace {

constexpr size_t kMaxFileBytes = 4 << 20;
// How long a run waits for the other runs' updates of the same file.
constexpr long long kLockWaitNs = 5'000'000'000LL;

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

// One sample line: NAME{K="V",...} VALUE. nullopt when it is not one.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
std::optional<Sample> parse_sample(std::string_view line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) ++i;
  if (i == 0) return std::nullopt;
  s.name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
      std::string key(line.substr(i, eq - i));
      std::string value;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value += line[j] == 'n' ? '\n' : line[j];
        } else {
          value += line[j];
        }
      }
      if (j >= line.size()) return std::nullopt;
      s.labels[key] = value;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  const std::string text(line.substr(i));
  char* end = nullptr;
  errno = 0;
  s.value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end == text.c_str() || (*end != '\0' && *end != ' ')) return std::nullopt;
  return s;
}

std::string file_name(const std::string& lock_id) { return "looplock_" + lock_id + ".prom"; }

}  // namespace

std::string_view outcome_name(RunOutcome o) {
  switch (o) {
    case RunOutcome::Success: return "success";
    case RunOutcome::Failure: return "failure";
    case RunOutcome::Signaled: return "signaled";
    case RunOutcome::Skipped: return "skipped";
    case RunOutcome::Timeout: return "timeout";
    case RunOutcome::LeaseLost: return "lease_lost";
    case RunOutcome::MaxTime: return "max_time";
    case RunOutcome::Error: return "error";
  }
  return "error";
}

std::string label_value(std::string_view raw) {
  // Valid UTF-8 first: nlohmann-json's replacing dump, read back.
  const std::string valid = Json::parse(dump_json(Json(clip_bytes(std::string(raw))))).get<std::string>();
  std::string out;
  out.reserve(valid.size());
  for (char c : valid) {
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
  std::string out;
  out += "# HELP looplock_runs_total Runs of looplock on this lock, by how they ended.\n";
  out += "# TYPE looplock_runs_total counter\n";
  for (const auto& [op, series] : f.operations) {
    for (RunOutcome o : kAllOutcomes) {
      auto it = series.runs.find(o);
      out += std::string(kRunsName) + "{" + labels(f, op) + ",outcome=\"" + std::string(outcome_name(o)) + "\"} " +
             number(it == series.runs.end() ? 0 : it->second, false) + "\n";
    }
  }
  for (const auto& g : kGauges) {
    out += std::string("# HELP ") + g.name + " " + g.help + "\n";
    out += std::string("# TYPE ") + g.name + " gauge\n";
    for (const auto& [op, series] : f.operations) {
      out += std::string(g.name) + "{" + labels(f, op) + "} " + number(series.*g.field, g.timestamp) + "\n";
    }
  }
  return out;
}

MetricsFile parse_metrics(std::string_view text) {
  MetricsFile f;
  sys::for_each_line(text, [&](std::string_view line) {
    if (line.empty() || line.front() == '#') return;
    auto s = parse_sample(line);
    if (!s || !s->labels.contains("operation")) return;
    if (f.lock_id.empty()) f.lock_id = s->labels["lock_id"];
    if (f.loop.empty()) f.loop = s->labels["loop"];
    OperationSeries& series = f.operations[s->labels["operation"]];
    if (s->name == kRunsName) {
      if (auto o = outcome_from(s->labels["outcome"])) series.runs[*o] = s->value;
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
  OperationSeries& s = f.operations[run.operation];
  s.runs[run.outcome] += 1;
  s.last_start = run.start_s;
  if (run.outcome == RunOutcome::Success) s.last_success = run.end_s;
  s.last_exit_status = run.exit_status;
  s.last_duration = run.duration_s;
  s.last_wait = run.wait_s;
}

std::string update_metrics_file(const std::string& dir, const RunMetrics& run) {
  auto failed = [&](const std::string& what) { return what + ": " + std::strerror(errno); };
  UniqueFd dirfd(sys::retry_eintr([&] { return ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); }));
  if (!dirfd) return failed("cannot open the metrics directory " + dir);
  const std::string name = file_name(run.lock_id);

  // One update at a time, so that counters carry over without losing any.
  UniqueFd lock(sys::retry_eintr([&] {
    return openat(dirfd.get(), ("." + name + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY,
                  0644);
  }));
  if (!lock) return failed("cannot open " + dir + "/." + name + ".lock");
  const long long give_up = sys::monotonic_ns() + kLockWaitNs;
  while (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return failed("cannot lock " + dir + "/." + name + ".lock");
    if (sys::monotonic_ns() >= give_up) return "the metrics file " + dir + "/" + name + " stayed busy for 5 s";
    timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
  }

  MetricsFile f;
  UniqueFd old(sys::retry_eintr(
      [&] { return openat(dirfd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  if (old) {
    if (auto text = sys::pread_all(old.get(), kMaxFileBytes)) f = parse_metrics(*text);
  }
  add_run(f, run);
  const std::string text = render_metrics(f);

  const std::string tmp = "." + name + "." + std::to_string(getpid()) + ".tmp";
  UniqueFd out(sys::retry_eintr([&] {
    return openat(dirfd.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
  }));
  if (!out) return failed("cannot create " + dir + "/" + tmp);
  std::string err;
  if (!sys::write_all(out.get(), text)) err = failed("cannot write " + dir + "/" + tmp);
  if (err.empty() && ::close(out.release()) != 0) err = failed("cannot write " + dir + "/" + tmp);
  if (err.empty() && renameat(dirfd.get(), tmp.c_str(), dirfd.get(), name.c_str()) != 0) {
    err = failed("cannot rename " + tmp + " to " + dir + "/" + name);
  }
  if (!err.empty()) unlinkat(dirfd.get(), tmp.c_str(), 0);
  return err;
}

}  // namespace looplock
