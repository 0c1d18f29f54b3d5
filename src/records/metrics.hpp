// --metrics-dir: one Prometheus node_exporter textfile per lock,
// DIR/looplock_<lock_id>.prom, rewritten after every run: written whole into
// a kept staging file, DIR/.looplock_<lock_id>.prom.next, and swapped in with
// renameat2(RENAME_EXCHANGE), so that the collector never reads half a file
// and no inode is created or freed (metrics.cpp says when a temporary file
// and a rename are used instead). Counters carry over from the previous
// file; the read-modify-write is serialised with a flock(2) on a sibling
// file, DIR/.looplock_<lock_id>.prom.lock, so that no increment is lost when
// many runs end at once. Series are labelled with lock_id, loop (DIR's base
// name, never a path) and operation.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/outcome.hpp"
#include "os/failure.hpp"

namespace looplock {

// One run, as the metrics see it.
struct RunMetrics {
  std::string lock_id;
  std::string loop;  // DIR's base name
  std::string operation;
  RunOutcome outcome = RunOutcome::Error;
  int exit_status = 0;  // looplock's status (128+N for a signal)
  double start_s = 0;   // wall clock, seconds since the epoch
  double end_s = 0;
  double wait_s = 0;      // waiting for the lock(s)
  double duration_s = 0;  // the command's run (0 when it did not run)
};

// The state kept in one file: per operation, the counters by outcome and the
// last run's gauges.
struct OperationSeries {
  std::map<RunOutcome, double> runs;
  double last_start = 0, last_success = 0, last_exit_status = 0, last_duration = 0, last_wait = 0;
};
struct MetricsFile {
  std::string lock_id;
  std::string loop;
  std::map<std::string, OperationSeries> operations;  // by operation
};

// The file's text (HELP and TYPE lines, then every series), and back. parse
// reads what render writes (it is not a general parser of the format) and
// skips lines it does not understand.
std::string render_metrics(const MetricsFile& f);
MetricsFile parse_metrics(std::string_view text);
// Adds one run to the state.
void add_run(MetricsFile& f, const RunMetrics& run);

// A label value as the text format writes it: valid UTF-8 (invalid bytes
// become U+FFFD), at most 256 bytes, with \, " and newline escaped.
std::string label_value(std::string_view raw);

// "looplock_<lock_id>.prom": the file's name in the metrics directory.
std::string metrics_file_name(const std::string& lock_id);

// Updates DIR/looplock_<lock_id>.prom with `run`. Returns none, or what went
// wrong (for one warning: metrics never change the exit status).
std::optional<sys::Failure> update_metrics_file(const std::string& dir, const RunMetrics& run);

}  // namespace looplock
