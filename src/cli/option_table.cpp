#include "cli/option_table.hpp"

#include <array>

namespace looplock {

namespace {

constexpr unsigned kBoth = kInRun | kInInspect;

// clang-format off
constexpr std::array kTable = {
  OptionSpec{"policy", 'p', "NAME", Section::Policy, kInRun, false, false,
             "mutation (wait 5 s, default), monitor (1 s),\n"
             "single_flight (no wait: skip, exit 0),\n"
             "blocking (wait without limit)"},
  OptionSpec{"timeout", 'w', "DURATION", Section::Policy, kInRun, false, false,
             "deadline for mutation/monitor (0: one attempt)"},
  OptionSpec{"nonblock", 'n', "", Section::Policy, kInRun, false, false, "one attempt: -w 0 (as flock -n)"},
  OptionSpec{"conflict-exit-code", 'E', "N", Section::Policy, kInRun, false, false,
             "status when the deadline passes (default 75)"},
  OptionSpec{"skip-exit-code", 0, "N", Section::Policy, kInRun, false, false,
             "status of a single_flight skip (default 0)"},
  OptionSpec{"shared", 's', "", Section::LockAndCommand, kInRun, false, false, "take a shared (reader) lock"},
  OptionSpec{"exclusive", 'x', "", Section::LockAndCommand, kInRun, false, false,
             "take an exclusive lock (the default)"},
  OptionSpec{"close", 'o', "", Section::LockAndCommand, kInRun, false, false, "do not pass the lock fd to COMMAND"},
  OptionSpec{"no-fork", 'F', "", Section::LockAndCommand, kInRun, false, false, "exec COMMAND in place of looplock"},
  OptionSpec{"kill-after", 0, "DURATION", Section::LockAndCommand, kInRun, false, true,
             "send KILL to the job if a forwarded TERM/INT\n"
             "has not ended it within DURATION (0: never)"},
  OptionSpec{"max-time", 0, "DURATION", Section::LockAndCommand, kInRun, false, true,
             "end the job once it has run this long: TERM,\n"
             "KILL --kill-after later (default 5s); exit 124"},
  OptionSpec{"agent", 0, "ID", Section::LockAndCommand, kInRun, false, false,
             "who runs it (default $LOOPLOCK_AGENT or user)"},
  OptionSpec{"operation", 0, "NAME", Section::LockAndCommand, kInRun, false, false,
             "what runs (default: the command or script name)"},
  OptionSpec{"unlock", 'u', "", Section::LockAndCommand, kInRun, false, false, ""},
  OptionSpec{"warn-before", 0, "DURATION", Section::LockAndCommand, kInRun, false, true,
             "signal the job DURATION before --max-time's TERM\n"
             "(or a failing lease's)"},
  OptionSpec{"warn-signal", 0, "SIG", Section::LockAndCommand, kInRun, false, true,
             "the signal of --warn-before (default USR1)"},
  OptionSpec{"once-per", 0, "DURATION", Section::Schedule, kInRun, false, true,
             "run at most once per DURATION (a run ledger;\n"
             "skip, exit 0, when the slot's run is done)"},
  OptionSpec{"jitter", 0, "DURATION", Section::Schedule, kInRun, false, false,
             "wait a random time below DURATION first"},
  OptionSpec{"verbose", 'v', "", Section::Output, kBoth, false, false, "report waiting, acquiring and releasing"},
  OptionSpec{"quiet", 'q', "", Section::Output, kBoth, false, false,
             "errors only (a single_flight skip is silent)"},
  OptionSpec{"log-format", 0, "FORMAT", Section::Output, kBoth, false, false,
             "stderr lines as text (default) or json"},
  OptionSpec{"metrics-dir", 0, "DIR", Section::Output, kBoth, false, false,
             "write a node_exporter textfile per lock there\n"
             "(default $LOOPLOCK_METRICS_DIR)"},
  OptionSpec{"inspect", 0, "", Section::Inspect, kBoth, false, false,
             "report who holds and who waits for each DIR's\n"
             "lock; change nothing"},
  OptionSpec{"json", 0, "", Section::Inspect, kInInspect, false, false,
             "print the reports as JSON (an array for several)"},
  OptionSpec{"check", 0, "", Section::Inspect, kInInspect, false, false, "exit 1 when a report carries a warning"},
  OptionSpec{"stale-after", 0, "DURATION", Section::Inspect, kInInspect, false, false,
             "warn about holds older than this (default 2h)"},
  OptionSpec{"incidents", 0, "N", Section::Inspect, kInInspect, false, false,
             "show the newest N incident rows (default 1)"},
  OptionSpec{"etcd", 0, "ENDPOINTS", Section::Cluster, kBoth, false, true,
             "also lock across hosts on etcd (comma-separated\n"
             "http[s]://HOST:PORT; default $LOOPLOCK_ETCD)"},
  OptionSpec{"lock-name", 0, "NAME", Section::Cluster, kBoth, true, false,
             "cluster lock name (default: DIR's base name)"},
  OptionSpec{"ttl", 0, "SECONDS", Section::Cluster, kInRun, true, false,
             "etcd lease time to live (default 10, >= 2)"},
  OptionSpec{"etcd-cacert", 0, "FILE", Section::Cluster, kBoth, true, false,
             "CA of etcd's certificates (https:// endpoints)"},
  OptionSpec{"etcd-cert", 0, "FILE", Section::Cluster, kBoth, true, false,
             "client certificate for etcd (with --etcd-key)"},
  OptionSpec{"etcd-key", 0, "FILE", Section::Cluster, kBoth, true, false, "the client certificate's private key"},
  OptionSpec{"etcd-user", 0, "NAME", Section::Cluster, kBoth, true, false,
             "etcd user; the password is in\n"
             "$LOOPLOCK_ETCD_PASSWORD or --etcd-password-file"},
  OptionSpec{"etcd-password-file", 0, "FILE", Section::Cluster, kBoth, true, false,
             "file holding the etcd user's password"},
  OptionSpec{"help", 'h', "", Section::Other, kBoth, false, false, "show this help"},
  OptionSpec{"version", 'V', "", Section::Other, kBoth, false, false, "show the version"},
};

constexpr std::array kConflicts = {
  OptionConflict{"verbose", "quiet", "", ""},
  OptionConflict{"nonblock", "timeout", "", ""},
  OptionConflict{"shared", "exclusive", "", ""},
  OptionConflict{"no-fork", "close", "", "With -F the command itself holds the lock; drop one of them."},
  OptionConflict{"once-per", "shared", "readers run together, so none of them owns the run ledger", ""},
  OptionConflict{"etcd", "shared", "shared cluster locks are not supported",
                 "Drop -s, or run without --etcd (and without $LOOPLOCK_ETCD) for a shared local lock."},
};
// clang-format on

}  // namespace

std::string_view section_title(Section s) {
  switch (s) {
    case Section::Policy: return "Policy";
    case Section::LockAndCommand: return "Lock and command";
    case Section::Schedule: return "Schedule";
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
  for (Section s : {Section::Policy, Section::LockAndCommand, Section::Schedule, Section::Output, Section::Inspect,
                    Section::Cluster, Section::Other}) {
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
