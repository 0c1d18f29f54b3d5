#include "cli/option_table.hpp"

#include <array>

namespace looplock {

namespace {

constexpr unsigned kBoth = kInRun | kInInspect;
constexpr unsigned kAll = kInRun | kInInspect | kInRelease;

// clang-format off
constexpr std::array kPolicies = {
  ValueWord{.word = "mutation", .about = "wait up to 5 s, else exit 75 (default)"},
  ValueWord{.word = "monitor", .about = "wait up to 1 s, else exit 75"},
  ValueWord{.word = "single_flight", .about = "do not wait: skip the command and exit 0"},
  ValueWord{.word = "blocking", .about = "wait without limit"},
  ValueWord{.word = "coalesce", .about = "one waiter per --operation; later runs join it and skip"},
};
constexpr std::array kFormats = {
  ValueWord{.word = "text", .about = "looplock: ... lines (default)"},
  ValueWord{.word = "json", .about = "one JSON object per line"},
};
constexpr std::array kSignals = {
  ValueWord{.word = "USR1"}, ValueWord{.word = "USR2"}, ValueWord{.word = "HUP"}, ValueWord{.word = "INT"},
  ValueWord{.word = "TERM"}, ValueWord{.word = "QUIT"}, ValueWord{.word = "ALRM"}, ValueWord{.word = "WINCH"},
};

constexpr std::array kShells = {ValueWord{.word = "bash"}, ValueWord{.word = "zsh"}, ValueWord{.word = "fish"}};

constexpr std::array kTable = {
  OptionSpec{.name = "policy", .letter = 'p', .value = "NAME", .section = Section::Policy, .applies = kInRun,
             .help = "mutation (wait 5 s, default), monitor (1 s),\n"
                     "single_flight (no wait: skip, exit 0),\n"
                     "blocking (wait without limit),\n"
                     "coalesce (one waiter per --operation; later\n"
                     "ticks join it and skip, exit 0)",
             .brief = "how to wait for the lock", .completes = Completes::Words, .words = kPolicies},
  OptionSpec{.name = "timeout", .letter = 'w', .value = "DURATION", .section = Section::Policy, .applies = kInRun,
             .help = "deadline for mutation/monitor/coalesce\n"
                     "(0: one attempt)",
             .brief = "deadline for mutation/monitor/coalesce", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "nonblock", .letter = 'n', .section = Section::Policy, .applies = kInRun,
             .help = "one attempt: -w 0 (as flock -n)",
             .brief = "one attempt: -w 0 (as flock -n)"},
  OptionSpec{.name = "conflict-exit-code", .letter = 'E', .value = "N", .section = Section::Policy, .applies = kInRun,
             .help = "status when the deadline passes (default 75)",
             .brief = "status when the deadline passes (default 75)", .hint = "exit status (1-255)"},
  OptionSpec{.name = "skip-exit-code", .value = "N", .section = Section::Policy, .applies = kInRun,
             .help = "status of a skip (single_flight, coalesce;\n"
                     "default 0)",
             .brief = "status of a skip: single_flight, coalesce (default 0)", .hint = "exit status (0-255)"},
  OptionSpec{.name = "shared", .letter = 's', .section = Section::LockAndCommand, .applies = kInRun,
             .help = "take a shared (reader) lock",
             .brief = "take a shared (reader) lock"},
  OptionSpec{.name = "exclusive", .letter = 'x', .section = Section::LockAndCommand, .applies = kInRun,
             .help = "take an exclusive lock (the default)",
             .brief = "take an exclusive lock (the default)"},
  OptionSpec{.name = "holders", .value = "N", .section = Section::LockAndCommand, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "let up to N runs (2-1024) hold the lock at\n"
                     "once, each with $LOOPLOCK_HOLDER_INDEX",
             .brief = "let up to N runs hold the lock at once", .hint = "number of holders (2-1024)"},
  OptionSpec{.name = "close", .letter = 'o', .section = Section::LockAndCommand, .applies = kInRun,
             .help = "do not pass the lock fd to COMMAND",
             .brief = "do not pass the lock fd to COMMAND"},
  OptionSpec{.name = "no-fork", .letter = 'F', .section = Section::LockAndCommand, .applies = kInRun,
             .help = "exec COMMAND in place of looplock",
             .brief = "exec COMMAND in place of looplock"},
  OptionSpec{.name = "kill-after", .value = "DURATION", .section = Section::LockAndCommand, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "send KILL to the job if a forwarded TERM/INT\n"
                     "has not ended it within DURATION (0: never)",
             .brief = "send KILL if a forwarded TERM/INT has not ended COMMAND", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "max-time", .value = "DURATION", .section = Section::LockAndCommand, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "end the job once it has run this long: TERM,\n"
                     "KILL --kill-after later (default 5s); exit 124",
             .brief = "terminate COMMAND once it has run this long (exit 124)", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "agent", .value = "ID", .section = Section::LockAndCommand, .applies = kInRun,
             .help = "who runs it (default $LOOPLOCK_AGENT or user)",
             .brief = "who runs it", .hint = "agent id"},
  OptionSpec{.name = "operation", .value = "NAME", .section = Section::LockAndCommand, .applies = kInRun,
             .help = "what runs (default: the command or script name)",
             .brief = "what runs", .hint = "operation name"},
  OptionSpec{.name = "unlock", .letter = 'u', .section = Section::LockAndCommand, .applies = kInRun},
  OptionSpec{.name = "warn-before", .value = "DURATION", .section = Section::LockAndCommand, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "signal the job DURATION before --max-time's TERM\n"
                     "(or a failing lease's)",
             .brief = "signal the job DURATION before --max-time's TERM (or a failing lease's)", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "warn-signal", .value = "SIG", .section = Section::LockAndCommand, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "the signal of --warn-before (default USR1)",
             .brief = "the signal of --warn-before (default USR1)", .completes = Completes::Words, .words = kSignals},
  OptionSpec{.name = "once-per", .value = "DURATION", .section = Section::Schedule, .applies = kInRun,
             .not_with_no_fork = true,
             .help = "run at most once per DURATION (a run ledger;\n"
                     "skip, exit 0, when the slot's run is done)",
             .brief = "run at most once per DURATION (a run ledger)", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "jitter", .value = "DURATION", .section = Section::Schedule, .applies = kInRun,
             .help = "wait a random time below DURATION first",
             .brief = "wait a random time below DURATION first", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "hold", .section = Section::Hold, .applies = kInRun, .not_with_no_fork = true,
             .help = "take DIR's lock in a detached holder and print\n"
                     "LOOPLOCK_HOLD=VALUE once held (no COMMAND;\n"
                     "needs --max-time)",
             .brief = "take the lock in a detached holder; print LOOPLOCK_HOLD=VALUE"},
  OptionSpec{.name = "tied-to", .value = "PID", .section = Section::Hold, .applies = kInRun,
             .help = "with --hold: end the hold when PID exits",
             .brief = "with --hold: end the hold when PID exits", .completes = Completes::Pid, .hint = "process id"},
  OptionSpec{.name = "release", .section = Section::Hold, .applies = kInRelease,
             .help = "end the hold $LOOPLOCK_HOLD (or the VALUE\n"
                     "given) names: looplock --release [VALUE]",
             .brief = "end the hold $LOOPLOCK_HOLD or VALUE names"},
  OptionSpec{.name = "force", .section = Section::Hold, .applies = kInRelease,
             .help = "with --release, and DIR: end DIR's hold once\n"
                     "the kernel confirms its holder",
             .brief = "with --release DIR: end the hold the kernel confirms"},
  OptionSpec{.name = "verbose", .letter = 'v', .section = Section::Output, .applies = kAll,
             .help = "report waiting, acquiring and releasing",
             .brief = "report waiting, acquiring and releasing"},
  OptionSpec{.name = "quiet", .letter = 'q', .section = Section::Output, .applies = kAll,
             .help = "errors only (a single_flight skip is silent)",
             .brief = "errors only"},
  OptionSpec{.name = "log-format", .value = "FORMAT", .section = Section::Output, .applies = kAll,
             .help = "stderr lines as text (default) or json",
             .brief = "format of the stderr lines", .completes = Completes::Words, .words = kFormats},
  OptionSpec{.name = "metrics-dir", .value = "DIR", .section = Section::Output,
             .help = "write a node_exporter textfile per lock there\n"
                     "(default $LOOPLOCK_METRICS_DIR)",
             .brief = "write a node_exporter textfile per lock into DIR", .completes = Completes::Dir, .hint = "metrics directory"},
  OptionSpec{.name = "notify", .value = "COMMAND", .section = Section::Output, .applies = kInRun,
             .help = "run COMMAND (sh -c) for each event, its JSON\n"
                     "on stdin, $LOOPLOCK_EVENT its name",
             .brief = "run COMMAND (sh -c) for each event, its JSON on stdin", .completes = Completes::ShellCommand, .hint = "notifier command"},
  OptionSpec{.name = "notify-on", .value = "LIST", .section = Section::Output, .applies = kInRun,
             .help = "the events to notify (default: warnings,\n"
                     "errors and held_too_long; all: every one)",
             .brief = "events to notify, comma-separated (default: warnings, errors, held_too_long)", .hint = "event names"},
  OptionSpec{.name = "notify-timeout", .value = "DURATION", .section = Section::Output, .applies = kInRun,
             .help = "KILL a notifier after DURATION (default 10s)",
             .brief = "KILL a notifier after DURATION (default 10s)", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "notify-after", .value = "DURATION", .section = Section::Output, .applies = kInRun,
             .help = "held_too_long once the job has run DURATION",
             .brief = "held_too_long once the job has run DURATION", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "inspect", .section = Section::Inspect,
             .help = "report who holds and who waits for each DIR's\n"
                     "lock; change nothing",
             .brief = "report who holds the lock of DIR; change nothing"},
  OptionSpec{.name = "json", .section = Section::Inspect, .applies = kInInspect,
             .help = "print the reports as JSON (an array for several)",
             .brief = "with --inspect: print the report as one JSON object"},
  OptionSpec{.name = "check", .section = Section::Inspect, .applies = kInInspect,
             .help = "exit 1 when a report carries a warning",
             .brief = "with --inspect: exit 1 when a report carries a warning"},
  OptionSpec{.name = "stale-after", .value = "DURATION", .section = Section::Inspect, .applies = kInInspect,
             .help = "warn about holds older than this (default 2h)",
             .brief = "with --inspect: warn about holds older than this", .hint = "duration (ms, s, m, h, d)"},
  OptionSpec{.name = "incidents", .value = "N", .section = Section::Inspect, .applies = kInInspect,
             .help = "show the newest N incident rows (default 1)",
             .brief = "with --inspect: show the newest N incident rows", .hint = "number of rows (1-1000)"},
  OptionSpec{.name = "etcd", .value = "ENDPOINTS", .section = Section::Cluster,
             .not_with_no_fork = true,
             .help = "also lock across hosts on etcd (comma-separated\n"
                     "http[s]://HOST:PORT; default $LOOPLOCK_ETCD)",
             .brief = "also lock across hosts on etcd", .hint = "endpoints (http[s]://HOST:PORT,...)"},
  OptionSpec{.name = "lock-name", .value = "NAME", .section = Section::Cluster, .needs_etcd = true,
             .help = "cluster lock name (default: DIR's base name)",
             .brief = "cluster lock name (default: the base name of DIR)", .hint = "lock name"},
  OptionSpec{.name = "ttl", .value = "SECONDS", .section = Section::Cluster, .applies = kInRun, .needs_etcd = true,
             .help = "etcd lease time to live (default 10, >= 2)",
             .brief = "etcd lease time to live in seconds (default 10)", .hint = "seconds"},
  OptionSpec{.name = "etcd-cacert", .value = "FILE", .section = Section::Cluster, .needs_etcd = true,
             .help = "CA of etcd's certificates (https:// endpoints)",
             .brief = "CA certificates that sign the etcd servers' certificates", .completes = Completes::File, .hint = "CA file"},
  OptionSpec{.name = "etcd-cert", .value = "FILE", .section = Section::Cluster, .needs_etcd = true,
             .help = "client certificate for etcd (with --etcd-key)",
             .brief = "client certificate for etcd", .completes = Completes::File, .hint = "certificate file"},
  OptionSpec{.name = "etcd-key", .value = "FILE", .section = Section::Cluster, .needs_etcd = true,
             .help = "the client certificate's private key",
             .brief = "private key of the client certificate", .completes = Completes::File, .hint = "key file"},
  OptionSpec{.name = "etcd-user", .value = "NAME", .section = Section::Cluster, .needs_etcd = true,
             .help = "etcd user; the password is in\n"
                     "$LOOPLOCK_ETCD_PASSWORD or --etcd-password-file",
             .brief = "etcd user name", .hint = "user name"},
  OptionSpec{.name = "etcd-password-file", .value = "FILE", .section = Section::Cluster, .needs_etcd = true,
             .help = "file holding the etcd user's password",
             .brief = "file holding the etcd user's password", .completes = Completes::File, .hint = "password file"},
  OptionSpec{.name = "completions", .value = "SHELL", .section = Section::Other, .applies = kAll,
             .help = "print the completion script for SHELL (bash,\n"
                     "zsh or fish)",
             .brief = "print the completion script for SHELL", .completes = Completes::Words, .words = kShells},
  OptionSpec{.name = "help", .letter = 'h', .section = Section::Other, .applies = kAll, .help = "show this help",
             .brief = "show help"},
  OptionSpec{.name = "version", .letter = 'V', .section = Section::Other, .applies = kAll,
             .help = "show the version",
             .brief = "show version"},
};

constexpr std::array kConflicts = {
  OptionConflict{.a = "verbose", .b = "quiet"},
  OptionConflict{.a = "nonblock", .b = "timeout"},
  OptionConflict{.a = "shared", .b = "exclusive"},
  OptionConflict{.a = "no-fork", .b = "close", .hint = "With -F the command itself holds the lock; drop one of them."},
  OptionConflict{.a = "no-fork", .b = "notify", .why = "with -F looplock becomes the command, and nobody is left to "
                 "deliver its events"},
  OptionConflict{.a = "holders", .b = "shared", .why = "--holders takes the lock shared itself, beside an index of "
                 "its own", .hint = "Drop -s: up to N runs with --holders N hold the lock together."},
  OptionConflict{.a = "holders", .b = "exclusive", .why = "--holders takes the lock shared, beside an index of its own"},
  OptionConflict{.a = "holders", .b = "once-per", .why = "N holders at once cannot share one slot's run ledger"},
  OptionConflict{.a = "once-per", .b = "shared", .why = "readers run together, so none of them owns the run ledger"},
  OptionConflict{.a = "hold", .b = "shared", .why = "a hold keeps the lock for the later steps, exclusively"},
  OptionConflict{.a = "hold", .b = "holders", .why = "a hold keeps the lock for the later steps, exclusively"},
  OptionConflict{.a = "hold", .b = "once-per", .why = "a skipped slot would let the later steps go on without the "
                 "lock"},
  OptionConflict{.a = "hold", .b = "notify", .why = "the notifier's relay would keep the caller's output open for the "
                 "whole hold", .hint = "Leave --notify out: the hold's incident rows and --release's status say how it "
                 "ended."},
  OptionConflict{.a = "etcd", .b = "shared", .why = "shared cluster locks are not supported",
                 .hint = "Drop -s, or run without --etcd (and without $LOOPLOCK_ETCD) for a shared local lock."},
};
// clang-format on

}  // namespace

std::string_view section_title(Section s) {
  switch (s) {
    case Section::Policy: return "Policy";
    case Section::LockAndCommand: return "Lock and command";
    case Section::Schedule: return "Schedule";
    case Section::Hold: return "Hold across steps";
    case Section::Output: return "Output";
    case Section::Inspect: return "Inspect";
    case Section::Cluster: return "Cluster";
    case Section::Other: return "Other";
  }
  return "Other";
}

std::span<const OptionSpec> option_table() { return kTable; }

const OptionSpec* find_option(std::string_view name) {
  for (const auto& o : kTable) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

std::string option_shown(const OptionSpec& o) {
  return (o.letter ? std::string("-") + o.letter + "/" : std::string()) + "--" + std::string(o.name);
}

std::span<const OptionConflict> option_conflicts() { return kConflicts; }

std::string options_help() {
  constexpr size_t kColumn = 30;  // where the explanations start
  std::string out;
  for (Section s : {Section::Policy, Section::LockAndCommand, Section::Schedule, Section::Hold, Section::Output,
                    Section::Inspect, Section::Cluster, Section::Other}) {
    out += std::string(section_title(s)) + ":\n";
    for (const auto& o : kTable) {
      if (o.section != s || o.help.empty()) continue;
      std::string head = o.letter ? std::string("  -") + o.letter + ", --" : std::string("      --");
      head += std::string(o.name) + (o.value.empty() ? "" : " " + std::string(o.value));
      head += head.size() + 2 <= kColumn ? std::string(kColumn - head.size(), ' ') : std::string(2, ' ');
      std::string_view help = o.help;
      for (bool first = true; !help.empty(); first = false) {
        const size_t nl = help.find('\n');
        out += (first ? head : std::string(kColumn, ' ')) + std::string(help.substr(0, nl)) + "\n";
        help = nl == std::string_view::npos ? std::string_view() : help.substr(nl + 1);
      }
    }
  }
  return out;
}

}  // namespace looplock
