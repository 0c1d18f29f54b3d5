#include "cli/options.hpp"

#include <cxxopts.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <string_view>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "cli/completions.hpp"
#include "cli/option_table.hpp"
#include "os/hold_process.hpp"
#include "os/job_control.hpp"
#include "os/signal_names.hpp"
#include "os/sys.hpp"
#include "run/notify.hpp"
#include "settings/endpoints.hpp"
#include "settings/lease_timing.hpp"

namespace looplock {

namespace {

constexpr std::string_view kTryHelp = "Try 'looplock --help' for more information.";

[[noreturn]] void usage_error(const std::string& message, std::string hint = std::string(kTryHelp)) {
  throw Fatal(exit_code::kUsage, message, std::move(hint));
}

// Options that take a value (from the table): the splitter must skip their
// values when it looks for "--" and "-c".
bool letter_takes_value(char c) {
  const auto table = option_table();
  return std::any_of(table.begin(), table.end(),
                     [&](const OptionSpec& o) { return o.letter == c && !o.value.empty(); });
}

bool long_takes_value(std::string_view arg) {
  // "--name" (value in the next argument); "--name=value" carries its own.
  if (!arg.starts_with("--") || arg.find('=') != std::string_view::npos) return false;
  arg.remove_prefix(2);
  const OptionSpec* o = find_option(arg);
  return o && !o->value.empty();
}

// For a group of short options like "-qw": whether its last value-taking
// option consumes the next argument.
bool short_group_takes_next(std::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg[1] == '-') return false;
  for (size_t i = 1; i < arg.size(); ++i) {
    if (letter_takes_value(arg[i])) {
      return i + 1 == arg.size();  // "-w5" carries its value
    }
  }
  return false;
}

// For "-w0.5" or "-qw0.5": the offset where the attached value starts.
std::optional<size_t> attached_short_value(std::string_view arg) {
  if (arg.size() < 3 || arg[0] != '-' || arg[1] == '-') return std::nullopt;
  for (size_t i = 1; i < arg.size(); ++i) {
    if (letter_takes_value(arg[i])) {
      if (i + 1 < arg.size()) return i + 1;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

struct Split {
  std::vector<std::string> own;  // argv[0] and looplock's own arguments
  std::vector<std::string> command;
  std::optional<std::string> shell_command;
  bool saw_dashdash = false;
};

Split split_argv(const std::vector<std::string>& argv) {
  Split s;
  if (argv.empty()) {
    s.own.emplace_back("looplock");
    return s;
  }
  s.own.push_back(argv[0]);
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      s.saw_dashdash = true;
      s.command.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
      return s;
    }
    if (a == "-c") {
      if (i + 1 >= argv.size()) {
        usage_error("option -c needs a SHELL-COMMAND", "Example: looplock DIR -c 'python3 status.py --tick'");
      }
      s.shell_command = argv[i + 1];
      if (i + 2 < argv.size()) {
        usage_error("unexpected argument " + quote(argv[i + 2]) + " after -c SHELL-COMMAND",
                    "Quote the whole shell command as one argument, or use '--' instead of -c.");
      }
      return s;
    }
    if (auto at = attached_short_value(a)) {
      // "-w0.5" and "-qw0.5": hand cxxopts the option and its value apart.
      s.own.push_back(a.substr(0, *at));
      s.own.push_back(a.substr(*at));
      continue;
    }
    s.own.push_back(a);
    if ((long_takes_value(a) || short_group_takes_next(a)) && i + 1 < argv.size()) {
      s.own.push_back(argv[++i]);
    }
  }
  return s;
}

// The table's rows that the command line names, or nullopt when it names
// an option the table does not have (or cannot be told apart: then every
// row is declared, so that cxxopts reports it as it reports any unknown
// option). Values are skipped the way split_argv() pairs them.
std::optional<std::vector<const OptionSpec*>> named_rows(const std::vector<std::string>& own) {
  std::vector<const OptionSpec*> rows;
  auto add = [&](const OptionSpec* o) {
    if (std::find(rows.begin(), rows.end(), o) == rows.end()) rows.push_back(o);
  };
  for (size_t i = 1; i < own.size(); ++i) {
    const std::string_view a = own[i];
    if (a.size() < 2 || a[0] != '-') continue;  // DIR, or "-" (a positional)
    if (a[1] == '-') {
      const OptionSpec* o = find_option(a.substr(2, a.find('=') - 2));
      if (!o) return std::nullopt;
      add(o);
      if (!o->value.empty() && a.find('=') == std::string_view::npos) ++i;  // its value
      continue;
    }
    for (size_t k = 1; k < a.size(); ++k) {
      const auto table = option_table();
      const auto o = std::find_if(table.begin(), table.end(), [&](const OptionSpec& r) { return r.letter == a[k]; });
      if (o == table.end()) return std::nullopt;
      add(&*o);
      if (o->value.empty()) continue;
      if (k + 1 == a.size()) ++i;  // "-w 5": the value is the next argument ("-w5" was split already)
      break;
    }
  }
  return rows;
}

// Declares to cxxopts the options the command line names (all of them when
// it names one the table lacks). Each declared option costs every run
// start-up time (cxxopts builds a map entry, shared pointers and a
// std::function for it, and the first one initialises std::locale: about
// 270 K instructions and a dozen first-touched pages for the whole table,
// docs/BENCHMARKS.md), so a plain `looplock DIR -- COMMAND` declares none.
// The positional arguments are cxxopts' unmatched ones.
cxxopts::Options build_parser(const std::vector<std::string>& own, bool declare_all) {
  cxxopts::Options parser("looplock", "");
  auto declare = [&](const OptionSpec& o) {
    const std::string names = (o.letter ? std::string(1, o.letter) + "," : std::string()) + std::string(o.name);
    if (o.value.empty()) {
      parser.add_options()(names, "");
    } else {
      parser.add_options()(names, "", cxxopts::value<std::string>());
    }
  };
  if (const auto rows = declare_all ? std::nullopt : named_rows(own)) {
    for (const OptionSpec* o : *rows) declare(*o);
  } else {
    for (const auto& o : option_table()) declare(o);
  }
  return parser;
}

// cxxopts' exception in looplock's words, with the option as it is typed
// ('--bogus', '-x') and plain quotes.
std::string cxxopts_message(const cxxopts::exceptions::exception& e, const std::vector<std::string>& own) {
  // cxxopts quotes the option with ‘ ’ (or ' ' without Unicode): take the
  // first quoted part.
  std::string text = e.what();
  auto unquote = [](std::string t) {
    for (const char* q : {"\u2018", "\u2019"}) {
      for (size_t at; (at = t.find(q)) != std::string::npos;) t.replace(at, std::string_view(q).size(), "'");
    }
    return t;
  };
  text = unquote(text);
  std::string name;
  if (auto a = text.find('\''); a != std::string::npos) {
    if (auto b = text.find('\'', a + 1); b != std::string::npos) name = text.substr(a + 1, b - a - 1);
  }
  const std::string typed = name.size() == 1 ? "-" + name : "--" + name;
  if (dynamic_cast<const cxxopts::exceptions::no_such_option*>(&e)) return "unknown option " + quote(typed);
  if (dynamic_cast<const cxxopts::exceptions::missing_argument*>(&e) ||
      dynamic_cast<const cxxopts::exceptions::option_requires_argument*>(&e)) {
    return "option " + quote(typed) + " needs a value";
  }
  if (dynamic_cast<const cxxopts::exceptions::gratuitous_argument_for_option*>(&e)) {
    return "option " + quote(typed) + " takes no value";
  }
  if (dynamic_cast<const cxxopts::exceptions::invalid_option_syntax*>(&e)) return "invalid option " + quote(name);
  if (dynamic_cast<const cxxopts::exceptions::incorrect_argument_type*>(&e)) {
    // "--quiet=x": a flag given a value.
    for (const auto& a : own) {
      if (a.starts_with("--") && a.ends_with("=" + name))
        return "option " + quote(a.substr(0, a.find('='))) + " takes no value";
    }
  }
  return "invalid command line: " + text;
}

Duration duration_option(const char* name, const std::string& text) {
  std::string why;
  auto d = parse_duration(text, &why);
  if (!d) usage_error("invalid --" + std::string(name) + " " + quote(text) + ": " + why);
  return *d;
}

std::optional<int> parse_int(std::string_view text) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

int parse_exit_code(const cxxopts::ParseResult& r, const char* name, int lo, int hi) {
  const auto& text = r[name].as<std::string>();
  auto v = parse_int(text);
  if (!v || *v < lo || *v > hi) {
    usage_error("invalid --" + std::string(name) + " " + quote(text) + ": expected an integer from " +
                std::to_string(lo) + " to " + std::to_string(hi));
  }
  return *v;
}

std::string base_name(std::string_view path) {
  while (path.size() > 1 && sys::is_path_separator(path.back())) path.remove_suffix(1);
  for (size_t i = path.size(); i-- > 0;) {
    if (sys::is_path_separator(path[i])) {
      path.remove_prefix(i + 1);
      break;
    }
  }
  // "python.exe" is "python" (Windows): one program, one operation.
  const std::string_view suffix = sys::program_suffix();
  if (!suffix.empty() && path.size() > suffix.size() &&
      equal_ignoring_case(path.substr(path.size() - suffix.size()), suffix)) {
    path.remove_suffix(suffix.size());
  }
  return std::string(path);
}

enum class Family { None, Shell, Python, Node, Perl };

Family interpreter_family(std::string_view base) {
  auto starts = [&](std::string_view p) { return base.starts_with(p); };
  if (base == "sh" || base == "bash" || base == "dash" || base == "zsh" || base == "ksh" || base == "mksh" ||
      base == "ash" || base == "busybox")
    return Family::Shell;
  if (starts("python") || starts("pypy") || base == "py") return Family::Python;  // py: the Windows launcher
  if (base == "node" || base == "nodejs" || base == "deno" || base == "bun") return Family::Node;
  if (starts("perl") || starts("ruby") || starts("php") || starts("lua") || base == "tclsh" || base == "Rscript")
    return Family::Perl;
  return Family::None;
}

}  // namespace

Duration lease_kill_after(std::optional<Duration> given, int ttl_s, std::string_view given_text) {
  if (!given) return lease_timing::default_kill_after(ttl_s);
  const std::string shown = given_text.empty() ? format_duration(*given) : std::string(given_text);
  const std::string what = "invalid --kill-after " + quote(shown) + " with --ttl " + std::to_string(ttl_s);
  // Truncated to 10 ms; the hint shows it cut to a printed digit, so the number shown is accepted.
  const Duration most =
      std::chrono::floor<std::chrono::duration<long long, std::centi>>(lease_timing::max_kill_after(ttl_s));
  const std::string room = "Give --kill-after " + format_duration(printed_floor(most)) + " or less (default at --ttl " +
                           std::to_string(ttl_s) + ": " + format_duration(lease_timing::default_kill_after(ttl_s)) +
                           "), or a longer --ttl.";
  if (*given == Duration::zero()) {
    usage_error(what + ": a lease holder must be killable before its lease expires (0 would never send KILL)", room);
  }
  if (*given > most) {
    usage_error(what +
                    ": TERM would leave too little of the lease to renew it (a quarter of the TTL must "
                    "remain to ride out an etcd outage)",
                room);
  }
  return *given;
}

namespace {

std::string operation_as_spelled(const std::vector<std::string>& command, bool fold_case) {
  if (command.empty()) return "command";
  std::string base = base_name(command[0]);
  if (fold_case) base = ascii_lower(base);
  Family fam = interpreter_family(base);
  if (fam == Family::None) return base.empty() ? "command" : base;
  auto script_name = [&](std::string_view a) {
    std::string script = base_name(a);
    return script.empty() ? base : script;
  };
  // Short option letters that introduce inline code or a module (no script
  // follows), and those that take a value.
  auto code_letter = [&](char c) {
    switch (fam) {
      case Family::Shell: return c == 'c';
      case Family::Python: return c == 'c' || c == 'm';
      case Family::Node: return c == 'e' || c == 'p';
      case Family::Perl: return c == 'e' || c == 'E';
      case Family::None: break;
    }
    return false;
  };
  auto value_letter = [&](char c) {
    switch (fam) {
      case Family::Shell: return c == 'o';
      case Family::Python: return c == 'W' || c == 'X';
      case Family::Node: return c == 'r';
      case Family::Perl: return c == 'I';
      case Family::None: break;
    }
    return false;
  };
  for (size_t i = 1; i < command.size(); ++i) {
    std::string_view a = command[i];
    if (a == "--") {
      if (i + 1 < command.size()) return script_name(command[i + 1]);
      break;
    }
    if (a.empty() || a == "-") break;
    const bool option = a[0] == '-' || (fam == Family::Shell && a[0] == '+' && a.size() > 1);
    if (!option) return script_name(a);  // the first non-option argument is the script
    if (a[1] == '-') {                   // a long option
      if (fam == Family::Node && (a == "--eval" || a == "--print")) break;
      if (fam == Family::Node && a == "--require") ++i;
      continue;
    }
    // A cluster of short options ("-ec", "-uc", "-Wignore", "+o"): its letters
    // up to the first that takes a value (the rest of the cluster is the value).
    bool code = false;
    for (size_t k = 1; k < a.size(); ++k) {
      if (code_letter(a[k])) {
        code = true;
        break;
      }
      if (value_letter(a[k])) {
        if (k + 1 == a.size()) ++i;  // the value is the next argument
        break;
      }
    }
    if (code) break;
  }
  return base;
}

}  // namespace

std::string derive_operation(const std::vector<std::string>& command) {
  // Where names are case-insensitive (Windows), Python.exe and PY.EXE are
  // python.exe and py.exe, and status.PY is status.py: one operation, one
  // slot, one metrics series, however the command is spelled.
  const bool fold = !sys::abilities().case_sensitive_names;
  const std::string op = operation_as_spelled(command, fold);
  return fold ? ascii_lower(op) : op;
}

namespace {

// The cxxopts parse of looplock's own arguments (never the command's).
cxxopts::ParseResult parse_own(const Split& split, bool declare_all) {
  for (const auto& a : split.own) {
    if (a == "--etcd-password" || a.starts_with("--etcd-password=")) {
      usage_error("--etcd-password is not an option: a password on the command line is visible to every user",
                  "Put it in $LOOPLOCK_ETCD_PASSWORD, or in a file for --etcd-password-file FILE.");
    }
  }
  cxxopts::Options parser = build_parser(split.own, declare_all);
  std::vector<const char*> cargv;
  cargv.reserve(split.own.size());
  for (const auto& a : split.own) cargv.push_back(a.c_str());
  try {
    return parser.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    usage_error(cxxopts_message(e, split.own));
  }
}

const std::string& text_of(const cxxopts::ParseResult& r, const char* name) { return r[name].as<std::string>(); }

// --release's VALUE ($LOOPLOCK_HOLD by default), or --force's DIR.
void read_release(const cxxopts::ParseResult& r, const std::vector<std::string>& positional, const Environment& env,
                  Options& o) {
  o.hold.force = r.count("force") > 0;
  if (!sys::abilities().hold) return;  // check_system() says --release is not available here
  if (positional.size() > 1) {
    usage_error("unexpected argument " + quote(positional[1]),
                "looplock --release [VALUE], or looplock --release --force DIR.");
  }
  if (o.hold.force) {
    if (positional.empty() || positional[0].empty()) {
      usage_error("--release --force needs DIR", "looplock --release --force DIR ends the hold of DIR's lock.");
    }
    o.dir = positional[0];
    return;
  }
  if (!positional.empty()) {
    o.hold.release_value = positional[0];
  } else if (env.looplock_hold && !env.looplock_hold->empty()) {
    o.hold.release_value = *env.looplock_hold;
  } else {
    usage_error(std::string("--release needs the hold's value: LOOPLOCK_HOLD is ") +
                    (env.looplock_hold ? "empty" : "not set"),
                "Give the value looplock --hold printed (after LOOPLOCK_HOLD=), or set LOOPLOCK_HOLD; an "
                "operator ends a stuck hold with looplock --release --force DIR.");
  }
}

// The mode: a run, --hold, --release or --inspect (one of them).
Mode mode_of(const cxxopts::ParseResult& r) {
  std::vector<std::string> modes;
  for (const char* m : {"inspect", "hold", "release"}) {
    if (r.count(m)) modes.push_back(std::string("--") + m);
  }
  if (modes.size() > 1) usage_error(modes[0] + " and " + modes[1] + " cannot be combined");
  if (r.count("inspect")) return Mode::Inspect;
  if (r.count("hold")) return Mode::Hold;
  return r.count("release") ? Mode::Release : Mode::Run;
}

// DIR (or the DIRs of --inspect), and flock(1)'s -u pointed elsewhere.
void read_dirs(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  if (r.count("unlock")) {
    usage_error("-u/--unlock is not an option: looplock releases the lock itself when the command has ended",
                "flock -u unlocks a descriptor; under looplock, a command that must let go early can close "
                "$LOOPLOCK_FD (and whatever it started), or run with -o so that only looplock holds the lock.");
  }
  const std::vector<std::string>& positional = r.unmatched();
  if (o.mode == Mode::Release) return read_release(r, positional, env, o);
  if (positional.empty()) {
    usage_error("missing DIR", o.mode == Mode::Inspect
                                   ? "Give the loop directories: looplock --inspect [--json] [--check] DIR..."
                                   : "Give the loop directory, then the command: looplock [OPTIONS] DIR -- COMMAND "
                                     "[ARG]...");
  }
  for (const auto& d : positional) {
    if (d.empty()) usage_error("DIR is an empty string");
  }
  if (positional.size() > 1 && o.mode == Mode::Hold) {
    usage_error("unexpected argument " + quote(positional[1]) + ": --hold takes DIR alone",
                "The hold keeps the lock for later steps; run them as looplock DIR -- COMMAND with LOOPLOCK_HOLD "
                "in their environment.");
  }
  if (positional.size() > 1 && o.mode != Mode::Inspect) {
    usage_error("unexpected argument " + quote(positional[1]) + " before '--'",
                "Put the command after '--': looplock DIR -- " + positional[1] + " ...");
  }
  o.dir = positional[0];
  o.inspect.dirs = positional;
}

// Whether option `name` is given (--etcd also by $LOOPLOCK_ETCD).
bool given(const cxxopts::ParseResult& r, const Options& o, std::string_view name) {
  if (name == "etcd" && !o.cluster.etcd.empty()) return true;
  return r.count(std::string(name)) > 0;
}

// What this system cannot do (os/sys.hpp's abilities(): Windows has no
// exec, no signals, no etcd transport yet): never a silent no-op.
void check_system(const cxxopts::ParseResult& r, const Options& o) {
  const sys::Abilities can = sys::abilities();
  if (!can.exec && r.count("no-fork")) {
    usage_error("-F/--no-fork is not available on this system: it has no exec, so looplock cannot become the command",
                "Leave -F out: looplock stays the command's parent, and exits as the command exited.");
  }
  for (const char* name : {"warn-before", "warn-signal"}) {
    if (!can.signals && r.count(name)) {
      usage_error("--" + std::string(name) + " is not available on this system: it has no signals to warn a job with",
                  "Leave it out; --max-time ends the job at once (TerminateJobObject), so a job that must save its "
                  "work keeps its own deadline, from the environment variable LOOPLOCK_DEADLINE.");
    }
  }
  if (!can.notify && r.count("notify")) {
    usage_error("--notify is not available on this system yet: looplock has no relay for its notifiers here",
                "Leave --notify out; the metrics file (--metrics-dir) and the incident rows say what happened.");
  }
  for (const char* name : {"hold", "release", "tied-to"}) {
    if (can.hold && r.count(name) && !sys::pidfds_available()) {
      usage_error("--" + std::string(name) + " needs pidfds (Linux 5.3 or later), which this system lacks",
                  "Hold the lock for one command at a time (looplock DIR -c 'step1 && step2').");
    }
    if (!can.hold && r.count(name)) {
      usage_error("--" + std::string(name) +
                      " is not available on this system yet: looplock cannot detach a "
                      "holder or pin a process here",
                  "Hold the lock for one command at a time (looplock DIR -c 'step1 && step2'), or take the hold "
                  "from a Linux host.");
    }
  }
  if (!can.holders && r.count("holders")) {
    usage_error("--holders is not available on this system yet: looplock cannot watch its index files here",
                "Leave --holders out (one run holds the lock at a time), or run the N-holder loop from a Linux host.");
  }
  if (!can.cluster && given(r, o, "etcd")) {
    usage_error(std::string("--etcd is not available on this system: looplock has no etcd transport here") +
                    (r.count("etcd") ? "" : " (LOOPLOCK_ETCD is set)"),
                r.count("etcd")
                    ? "Run the cluster lock from a Linux host, or lock a local DIR here."
                    : "Unset LOOPLOCK_ETCD (or set it empty) to lock a local DIR here; run the cluster lock "
                      "from a Linux host.");
  }
}

// The table's rules: each option applies in its modes only, some only with
// --etcd, some not with -F; and the pairs that exclude each other.
void check_applicable(const cxxopts::ParseResult& r, const Options& o) {
  const bool no_fork = r.count("no-fork") > 0;
  for (const auto& spec : option_table()) {
    if (!given(r, o, spec.name) || (spec.name == "etcd" && !r.count("etcd"))) continue;
    const std::string shown = option_shown(spec);
    if (o.mode == Mode::Inspect && !(spec.applies & kInInspect)) usage_error(shown + " does not apply to --inspect");
    if (o.mode == Mode::Release && !(spec.applies & kInRelease)) {
      usage_error(shown + " does not apply to --release",
                  "looplock --release [VALUE], or looplock --release --force DIR.");
    }
    if ((o.mode == Mode::Run || o.mode == Mode::Hold) && !(spec.applies & kInRun)) {
      usage_error(shown + (spec.applies == kInRelease ? " only applies to --release" : " only applies to --inspect"),
                  spec.name == "json" ? "Use --log-format json for JSON log lines." : std::string(kTryHelp));
    }
    if (spec.name == "tied-to" && o.mode != Mode::Hold) {
      usage_error("--tied-to only applies to --hold", "looplock --hold --max-time DURATION --tied-to PID DIR");
    }
    if (spec.needs_etcd && o.cluster.etcd.empty()) usage_error(shown + " applies only with --etcd ENDPOINTS");
  }
  if (o.mode != Mode::Run && o.mode != Mode::Hold) return;
  for (const auto& spec : option_table()) {
    if (spec.not_with_no_fork && no_fork && given(r, o, spec.name)) {
      usage_error(option_shown(spec) + (spec.name == "etcd" && !r.count("etcd") ? " ($LOOPLOCK_ETCD)" : "") +
                      " needs looplock to stay the command's parent; drop -F/--no-fork",
                  spec.name == "etcd" ? "looplock must stay to keep the etcd lease alive." : std::string(kTryHelp));
    }
  }
  for (const auto& c : option_conflicts()) {
    if (given(r, o, c.a) && given(r, o, c.b)) {
      usage_error(option_shown(*find_option(c.a)) + " and " + option_shown(*find_option(c.b)) + " cannot be combined" +
                      (c.why.empty() ? "" : ": " + std::string(c.why)),
                  c.hint.empty() ? std::string(kTryHelp) : std::string(c.hint));
    }
  }
}

// -p, -w, -n, -E, --skip-exit-code.
void read_policy(const cxxopts::ParseResult& r, Options& o) {
  if (r.count("policy")) {
    auto p = parse_policy(text_of(r, "policy"));
    if (!p) {
      usage_error("unknown policy " + quote(text_of(r, "policy")),
                  "Policies: mutation (default), monitor, single_flight, blocking, coalesce.");
    }
    o.wait.policy = *p;
  }
  // -n/--nonblock is flock(1)'s spelling of -w 0: one attempt under the policy in force.
  if (r.count("timeout") || r.count("nonblock")) {
    const bool w = r.count("timeout") > 0;
    if (!policy_takes_timeout(o.wait.policy)) {
      usage_error(std::string(w ? "-w/--timeout" : "-n/--nonblock") + " does not apply to policy " +
                      std::string(policy_name(o.wait.policy)),
                  "single_flight never waits and blocking waits without limit; use -p mutation, -p monitor or "
                  "-p coalesce with " +
                      std::string(w ? "-w." : "-n (or -p single_flight -q for a silent skip)."));
    }
    o.wait.timeout = w ? duration_option("timeout", text_of(r, "timeout")) : Duration::zero();
  }
  if (r.count("conflict-exit-code")) o.wait.conflict_exit_code = parse_exit_code(r, "conflict-exit-code", 1, 255);
  if (r.count("skip-exit-code")) o.wait.skip_exit_code = parse_exit_code(r, "skip-exit-code", 0, 255);
}

// -s, -o, -F, --kill-after, --max-time, --once-per, --jitter, --warn-before
// (and what they resolve to: the job's limits, the lease's kill-after).
void read_lock_and_job(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  o.lock.shared = r.count("shared") > 0;
  // Where no command can hold the lock (os/sys.hpp), -o is what always happens.
  o.lock.close_fd = r.count("close") > 0 || !sys::abilities().inherited_lock;
  o.lock.no_fork = r.count("no-fork") > 0;
  if (r.count("holders")) {
    const std::string& text = text_of(r, "holders");
    const auto n = parse_int(text);
    if (!n || *n < kMinHolders || *n > kMaxHolders) {
      usage_error("invalid --holders " + quote(text) + ": expected a number from " + std::to_string(kMinHolders) +
                      " to " + std::to_string(kMaxHolders),
                  "--holders N lets up to N runs hold the lock at once; without it one run holds it.");
    }
    o.lock.holders = static_cast<int>(*n);
  }
  std::optional<Duration> kill_after;  // as given: 0 and inf mean never
  if (r.count("kill-after")) kill_after = duration_option("kill-after", text_of(r, "kill-after"));
  if (r.count("max-time")) o.limits.max_time = limit_of(duration_option("max-time", text_of(r, "max-time")));
  if (r.count("once-per")) {
    const Duration d = duration_option("once-per", text_of(r, "once-per"));
    if (d == Duration::zero()) {
      usage_error("invalid --once-per " + quote(text_of(r, "once-per")) +
                  ": expected a duration above 0 (such as 4m for a */5 schedule)");
    }
    o.once_per.period = d;
  }
  if (r.count("jitter")) {
    const Duration d = duration_option("jitter", text_of(r, "jitter"));
    if (d > kMaxJitter) {
      usage_error("invalid --jitter " + quote(text_of(r, "jitter")) + ": at most 24h",
                  "--jitter spreads a schedule's runs over part of its interval (20s for a */5 schedule).");
    }
    if (d != Duration::zero()) o.once_per.jitter = d;
  }
  if (r.count("warn-signal") && !r.count("warn-before")) usage_error("--warn-signal applies only with --warn-before");
  o.limits.warn_signal = parse_signal("USR1").value_or(0);  // --warn-signal's default (0: the system has no USR1)
  if (r.count("warn-before")) {
    o.limits.warn_before = duration_option("warn-before", text_of(r, "warn-before"));
    // A later step of a hold has the hold's --max-time, when it runs inside it.
    const bool in_hold = o.mode == Mode::Run && env.looplock_hold && !env.looplock_hold->empty();
    if (!o.limits.max_time && o.cluster.etcd.empty() && !in_hold) {
      usage_error("--warn-before applies only with --max-time, --etcd, or in a later step of a hold",
                  "It signals the job before --max-time's TERM (a hold's included), or before a failing lease's.");
    }
    if (o.limits.max_time && *o.limits.warn_before >= *o.limits.max_time) {
      usage_error("invalid --warn-before " + quote(text_of(r, "warn-before")) + ": not shorter than --max-time " +
                  format_duration(*o.limits.max_time));
    }
    if (r.count("warn-signal")) {
      const auto sig = parse_signal(text_of(r, "warn-signal"));
      if (!sig) usage_error("invalid --warn-signal " + quote(text_of(r, "warn-signal")) + ": expected a signal name or number");
      if (const std::string name = signal_name(*sig); name == "KILL" || name == "STOP") {
        usage_error("invalid --warn-signal " + quote(text_of(r, "warn-signal")) +
                    ": KILL and STOP cannot be handled, so they warn nobody");
      }
      o.limits.warn_signal = *sig;
    }
  }
  // KILL after a forwarded TERM/INT: --kill-after, where 0 and inf mean
  // never, as in timeout(1); after --max-time's TERM: the same, or 5 s when
  // it was not given; before a lease can expire: the same, within what the
  // TTL allows, or a default that fits it.
  if (kill_after) o.limits.kill_after = limit_of(*kill_after);
  o.limits.max_time_kill_after = kill_after ? o.limits.kill_after : kDefaultKillAfter;
  if (!o.cluster.etcd.empty()) {
    o.cluster.lease_kill_after =
        lease_kill_after(kill_after, o.cluster.ttl_s, kill_after ? text_of(r, "kill-after") : std::string());
  }
}

// -v, -q, --log-format, --metrics-dir.
void read_output(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  if (r.count("verbose")) o.output.verbosity = Verbosity::Verbose;
  if (r.count("quiet")) o.output.verbosity = Verbosity::Quiet;
  if (r.count("log-format")) {
    const auto& f = text_of(r, "log-format");
    if (f == "text") {
      o.output.log_format = LogFormat::Text;
    } else if (f == "json") {
      o.output.log_format = LogFormat::Json;
    } else {
      usage_error("invalid --log-format " + quote(f) + ": expected text or json");
    }
  }
  if (r.count("metrics-dir")) {
    o.metrics_dir = text_of(r, "metrics-dir");
    if (o.metrics_dir.empty()) usage_error("invalid --metrics-dir '': expected a directory");
  } else if (env.metrics_dir && !env.metrics_dir->empty()) {
    o.metrics_dir = *env.metrics_dir;  // --inspect judges its files too
  }
}

// --notify, --notify-on, --notify-timeout, --notify-after.
void read_notify(const cxxopts::ParseResult& r, Options& o) {
  for (const char* name : {"notify-on", "notify-timeout", "notify-after"}) {
    if (r.count(name) && !r.count("notify")) {
      usage_error("--" + std::string(name) + " needs --notify COMMAND",
                  "Example: looplock --notify 'mail -s looplock ops' --notify-after 10m DIR -- CMD");
    }
  }
  if (!r.count("notify")) return;
  o.notify.command = text_of(r, "notify");
  if (o.notify.command.empty()) usage_error("invalid --notify '': expected a command");
  if (r.count("notify-on")) {
    std::string_view list = text_of(r, "notify-on");
    if (list.empty() || list.back() == ',') {
      usage_error("invalid --notify-on " + quote(list) + ": expected event names separated by commas",
                  "Without --notify-on, warnings, errors and held_too_long are notified; all is every event.");
    }
    while (!list.empty()) {
      const size_t comma = list.find(',');
      const std::string_view name = list.substr(0, comma);
      if (name.empty() || printable(name) != name || name.find(' ') != std::string_view::npos) {
        usage_error(
            "invalid --notify-on " + quote(text_of(r, "notify-on")) + ": expected event names separated by commas",
            "Names are the events of looplock-events(7) and started, ended, skipped, held_too_long; "
            "all is every event.");
      }
      if (const auto why = unnotifiable_event(std::string(name))) {
        usage_error("invalid --notify-on name " + quote(name) + ": " + *why,
                    "Names are the events of looplock-events(7) and started, ended, skipped, held_too_long; "
                    "all is every event.");
      }
      o.notify.on.emplace_back(name);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
  }
  if (r.count("notify-timeout")) {
    const Duration d = duration_option("notify-timeout", text_of(r, "notify-timeout"));
    if (d == Duration::zero()) {
      usage_error("invalid --notify-timeout " + quote(text_of(r, "notify-timeout")) + ": a notifier needs some time");
    }
    o.notify.timeout = d;
  }
  if (r.count("notify-after")) {
    const Duration d = duration_option("notify-after", text_of(r, "notify-after"));
    if (d == Duration::zero()) {
      usage_error("invalid --notify-after " + quote(text_of(r, "notify-after")) +
                  ": expected a time above 0 (inf: never)");
    }
    if (d != kForever) o.notify.after = d;
  }
}

// --etcd (or $LOOPLOCK_ETCD), before the rules are checked: whether the
// cluster lock is asked for decides which options apply.
void read_endpoints(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  if (r.count("etcd")) {
    o.cluster.etcd = text_of(r, "etcd");
    if (o.cluster.etcd.empty()) usage_error("invalid --etcd '': expected endpoints such as http://127.0.0.1:2379");
  } else if (env.looplock_etcd && !env.looplock_etcd->empty()) {
    o.cluster.etcd = *env.looplock_etcd;
  }
  if (o.cluster.etcd.empty()) return;
  auto parsed = etcd::parse_endpoints(o.cluster.etcd);
  if (!parsed.error.empty()) {
    usage_error("invalid --etcd " + quote(o.cluster.etcd) + " (or $LOOPLOCK_ETCD): " + parsed.error,
                "Give comma-separated http://HOST:PORT or https://HOST:PORT endpoints of the etcd cluster "
                "(etcd 3.4+).");
  }
  o.cluster.endpoints = std::move(parsed.endpoints);
}

// --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user, --etcd-password-file
// and their environment defaults.
void read_cluster_access(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  const bool any_tls =
      std::any_of(o.cluster.endpoints.begin(), o.cluster.endpoints.end(), [](const etcd::Endpoint& e) { return e.tls; });
  struct File {
    const char* option;
    const std::optional<std::string>& env_default;
    std::string& out;
  };
  for (File f : {File{"etcd-cacert", env.looplock_etcd_cacert, o.cluster.etcd_cacert},
                 File{"etcd-cert", env.looplock_etcd_client_cert, o.cluster.etcd_cert},
                 File{"etcd-key", env.looplock_etcd_client_key, o.cluster.etcd_key}}) {
    const std::string option = std::string("--") + f.option;
    if (r.count(f.option)) {
      f.out = text_of(r, f.option);
      if (f.out.empty()) usage_error("invalid " + option + " '': expected a file name");
      if (!any_tls) {
        usage_error(option + " " + quote(f.out) + " applies only to https:// endpoints",
                    "Give the etcd endpoints as https://HOST:PORT.");
      }
    } else if (any_tls && f.env_default && !f.env_default->empty()) {
      f.out = *f.env_default;  // the environment's default: only for https:// endpoints
    }
  }
  if (o.cluster.etcd_cert.empty() != o.cluster.etcd_key.empty()) {
    usage_error(std::string(o.cluster.etcd_cert.empty() ? "--etcd-key" : "--etcd-cert") + " needs " +
                    (o.cluster.etcd_cert.empty() ? "--etcd-cert" : "--etcd-key") + " too",
                "A client certificate goes with its private key: give both (or $LOOPLOCK_ETCD_CLIENT_CERT and "
                "$LOOPLOCK_ETCD_CLIENT_KEY).");
  }
  if (r.count("etcd-user")) {
    o.cluster.etcd_user = text_of(r, "etcd-user");
    if (o.cluster.etcd_user.empty()) usage_error("invalid --etcd-user '': expected an etcd user name");
  }
  if (r.count("etcd-password-file")) {
    o.cluster.etcd_password_file = text_of(r, "etcd-password-file");
    if (o.cluster.etcd_user.empty()) {
      usage_error("--etcd-password-file " + quote(o.cluster.etcd_password_file) + " applies only with --etcd-user NAME");
    }
    if (o.cluster.etcd_password_file.empty()) usage_error("invalid --etcd-password-file '': expected a file name");
  } else if (!o.cluster.etcd_user.empty()) {
    if (!env.looplock_etcd_password || env.looplock_etcd_password->empty()) {
      usage_error("--etcd-user " + quote(o.cluster.etcd_user) + " needs a password",
                  "Put it in $LOOPLOCK_ETCD_PASSWORD, or in a file for --etcd-password-file FILE (never on the "
                  "command line).");
    }
    o.cluster.etcd_password = env.looplock_etcd_password;
  }
}

// --lock-name, --ttl, TLS and login.
void read_cluster(const cxxopts::ParseResult& r, const Environment& env, Options& o) {
  if (o.cluster.etcd.empty()) return;
  if (r.count("lock-name")) {
    o.cluster.lock_name = text_of(r, "lock-name");
    if (!valid_lock_name(o.cluster.lock_name)) {
      usage_error("invalid --lock-name " + quote(o.cluster.lock_name) + ": expected 1 to 255 bytes without control characters");
    }
  }
  if (r.count("ttl")) {
    // A duration of whole seconds (10, 10s, 10.0s, 1m): etcd's leases count
    // in seconds.
    const auto& text = text_of(r, "ttl");
    const auto d = parse_duration(text);
    const bool whole = d && *d % std::chrono::seconds(1) == Duration::zero();
    if (!whole || *d < kMinTtl || *d > kMaxTtl) {
      usage_error("invalid --ttl " + quote(text) + ": expected whole seconds from " + std::to_string(kMinTtl.count()) +
                      " to " + std::to_string(kMaxTtl.count()) + " (10, 10s, 1m)",
                  d && !whole && *d != kForever ? "etcd's leases count in whole seconds." : std::string(kTryHelp));
    }
    o.cluster.ttl_s = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(*d).count());
  }
  read_cluster_access(r, env, o);
}

// --json, --check, --stale-after; and no command.
void read_inspect(const cxxopts::ParseResult& r, const Split& split, Options& o) {
  o.inspect.json = r.count("json") > 0;
  o.inspect.check = r.count("check") > 0;
  if (r.count("stale-after")) o.inspect.stale_after = duration_option("stale-after", text_of(r, "stale-after"));
  if (r.count("incidents")) {
    const auto n = parse_int(text_of(r, "incidents"));
    if (!n || *n < 1 || *n > static_cast<int>(kMaxIncidentsShown)) {
      usage_error("invalid --incidents " + quote(text_of(r, "incidents")) + ": expected a whole number from 1 to " +
                  std::to_string(kMaxIncidentsShown));
    }
    o.inspect.incidents = static_cast<size_t>(*n);
  }
  if (split.saw_dashdash || split.shell_command) {
    usage_error("--inspect takes no command", "Give only directories: looplock --inspect [--json] [--check] DIR...");
  }
}

// The command, and who runs what: --agent, --operation and their defaults.
void read_identity(const cxxopts::ParseResult& r, const Environment& env, Options& o, const std::string& derived);

void read_command(const cxxopts::ParseResult& r, const Split& split, const Environment& env, Options& o) {
  if (split.shell_command) {
    if (split.shell_command->empty()) {
      usage_error("option -c needs a non-empty SHELL-COMMAND", "Example: looplock DIR -c 'python3 status.py --tick'");
    }
    o.shell_form = true;
    o.command = sys::shell_argv(*split.shell_command);
  } else if (split.saw_dashdash) {
    if (split.command.empty())
      usage_error("no command after '--'", "Example: looplock DIR -- python3 status.py --tick");
    o.command = split.command;
  } else if (!o.dir.empty() && o.dir.find_first_not_of("0123456789") == std::string::npos) {
    usage_error("missing '--' before the command; " + quote(o.dir) + " is taken as DIR, not as a descriptor",
                "looplock locks a loop directory, not a descriptor (flock's 'flock N' form). Under looplock the "
                "command already holds the lock through $LOOPLOCK_FD; run it as looplock [OPTIONS] DIR -- COMMAND.");
  } else {
    usage_error("missing '--' before the command",
                "Put '--' between DIR and the command: looplock [OPTIONS] DIR -- COMMAND [ARG]..., or use "
                "-c SHELL-COMMAND.");
  }
  read_identity(r, env, o, o.shell_form ? base_name(o.command[0]) : derive_operation(o.command));
  if (o.once_per.period && o.identity.operation.size() > kMaxOncePerName) {
    usage_error("--once-per needs an operation name of at most " + std::to_string(kMaxOncePerName) + " bytes (" +
                    std::to_string(o.identity.operation.size()) + " given)",
                "Its slot is found by the whole name; give a shorter --operation NAME.");
  }
}

// --hold: no command, a --max-time, a policy that never skips, and the tie.
void read_hold(const cxxopts::ParseResult& r, const Split& split, const Environment& env, Options& o) {
  if (r.count("tied-to")) {
    const std::string& text = text_of(r, "tied-to");
    const auto pid = parse_int(text);
    if (pid && *pid == 0) {
      usage_error("--tied-to " + quote(text) + ": there is no process 0 to tie the hold to",
                  "In a container job $PPID is 0 (the step's shell is the container's first process): leave "
                  "--tied-to out there and release the hold in a last step that always runs; --max-time still "
                  "ends it.");
    }
    if (!pid || *pid < 0) usage_error("invalid --tied-to " + quote(text) + ": expected a process id");
    o.hold.tied_to = static_cast<Pid>(*pid);
  }
  if (split.saw_dashdash || split.shell_command) {
    usage_error("--hold takes no command: the hold keeps the lock for later steps",
                "Run each later step as looplock DIR -- COMMAND with LOOPLOCK_HOLD in its environment.");
  }
  if (!o.limits.max_time) {
    usage_error(
        r.count("max-time") ? "--hold needs a --max-time above 0 and below inf" : "--hold needs --max-time DURATION",
        "A hold nobody releases (a cancelled job) must still end: give the longest the steps may take, "
        "e.g. --max-time 30m.");
  }
  // Shorter, the hold could end before (or right after) it is reported.
  if (*o.limits.max_time < kMinHoldTime) {
    usage_error("--hold needs a --max-time of at least " + format_duration(kMinHoldTime) + " (" +
                    format_duration(*o.limits.max_time) + " given)",
                "The hold must outlast its own start; give the longest the steps may take, e.g. --max-time 30m.");
  }
  if (r.count("warn-before")) {
    usage_error("--warn-before cannot be used with --hold: the hold runs no command of yours to warn",
                "A step that runs when the hold's --max-time comes is ended with it, as by its own --max-time: "
                "give --warn-before to the step's looplock.");
  }
  if (o.wait.policy == Policy::SingleFlight || o.wait.policy == Policy::Coalesce) {
    usage_error("-p " + std::string(policy_name(o.wait.policy)) +
                    " cannot be used with --hold: a skip would let the later steps go on without the lock",
                "Use -p mutation (with -w) or -p blocking: a hold that cannot be taken then exits 75 (or -E).");
  }
  read_identity(r, env, o, "hold");
}

// --agent and --operation, and their defaults (`derived`: the operation's).
void read_identity(const cxxopts::ParseResult& r, const Environment& env, Options& o, const std::string& derived) {
  for (const char* name : {"agent", "operation"}) {
    if (r.count(name) && text_of(r, name).empty()) {
      usage_error("invalid --" + std::string(name) + " '': expected a non-empty " +
                      (name == std::string_view("agent") ? "ID" : "NAME"),
                  o.wait.policy == Policy::Coalesce && name == std::string_view("operation")
                      ? "-p coalesce coalesces the runs of one operation: name it, e.g. --operation tick."
                      : "Records, incident rows and metrics labels name the run by it; leave the option out for the "
                        "default.");
    }
  }
  o.identity.agent = r.count("agent") ? text_of(r, "agent")
                                      : (env.looplock_agent && !env.looplock_agent->empty()
                                             ? *env.looplock_agent
                                             : (env.user_name ? env.user_name() : std::string("unknown")));
  o.identity.operation = r.count("operation") ? text_of(r, "operation") : derived;
  // Runs coalesce by operation: a default taken from the command would let
  // `status.py --tick` and `status.py --check-gate` absorb each other.
  if (o.wait.policy == Policy::Coalesce && !r.count("operation")) {
    usage_error("-p coalesce needs --operation NAME",
                "Runs of one operation coalesce: a tick that finds one already waiting is absorbed by it. Name "
                "the operation explicitly, e.g. looplock -p coalesce --operation tick DIR -- ./status.py --tick");
  }
}

}  // namespace

Options parse_options(const std::vector<std::string>& argv, const Environment& env, bool declare_all) {
  const Split split = split_argv(argv);
  const cxxopts::ParseResult r = parse_own(split, declare_all);
  Options o;
  if (r.count("help")) {
    o.mode = Mode::Help;
    return o;
  }
  if (r.count("version")) {
    o.mode = Mode::Version;
    return o;
  }
  if (r.count("completions")) {
    o.mode = Mode::Completions;
    o.completions = text_of(r, "completions");
    if (!completion_script(o.completions)) {
      usage_error("invalid --completions " + quote(o.completions) + ": expected " + std::string(kCompletionShells),
                  "Install its output where the shell looks, e.g. looplock --completions bash > "
                  "~/.local/share/bash-completion/completions/looplock");
    }
    return o;
  }
  o.mode = mode_of(r);
  read_dirs(r, env, o);
  read_endpoints(r, env, o);
  check_system(r, o);
  check_applicable(r, o);
  read_output(r, env, o);
  read_cluster(r, env, o);
  if (o.mode == Mode::Inspect) {
    read_inspect(r, split, o);
    return o;
  }
  if (o.mode == Mode::Release) return o;
  read_policy(r, o);
  read_lock_and_job(r, env, o);
  read_notify(r, o);
  if (o.mode == Mode::Hold) {
    read_hold(r, split, env, o);
  } else {
    read_command(r, split, env, o);
  }
  return o;
}

LogFormat requested_log_format(int argc, char** argv) {
  LogFormat f = LogFormat::Text;
  for (int i = 1; i < argc && argv[i]; ++i) {
    const std::string_view a = argv[i];
    if (a == "--" || a == "-c") break;
    if (a == "--log-format" && i + 1 < argc && argv[i + 1]) {
      f = std::string_view(argv[++i]) == "json" ? LogFormat::Json : LogFormat::Text;
    } else if (a.starts_with("--log-format=")) {
      f = a.substr(13) == "json" ? LogFormat::Json : LogFormat::Text;
    }
  }
  return f;
}

const std::string& help_text() {
  static const std::string text = std::string(R"(Usage: looplock [OPTIONS] DIR -- COMMAND [ARG]...
       looplock [OPTIONS] DIR -c SHELL-COMMAND
       looplock --hold --max-time DURATION [--tied-to PID] [OPTIONS] DIR
       looplock --release [VALUE]    looplock --release --force DIR
       looplock --inspect [--json] [--check] [--stale-after DURATION] DIR...

)") +
                                  (sys::abilities().advisory_locks
                                       ? R"(Run COMMAND while holding the advisory lock on DIR/.state.lock (flock(2)),
then exit exactly as COMMAND exited.
)"
                                       : R"(Run COMMAND while holding the lock on DIR\.state.lock (LockFileEx on byte 0,
as msvcrt.locking takes it), then exit exactly as COMMAND exited. Not on
Windows: -F, --warn-before, --warn-signal, --etcd (looplock-windows(7)).
)") + "\n" + options_help() + R"(
Examples:
  looplock /srv/loops/nightly -- python3 scripts/status.py --tick
  looplock -p single_flight /srv/loops/nightly -- ./monitor.sh
  looplock --once-per 4m --operation tick /srv/loops/nightly -- ./tick.py
  looplock -w 30 /srv/loops/nightly -c 'status.py --approve && status.py --tick'

Exit status: COMMAND's own; 75 deadline passed; 124 --max-time passed;
64 usage; 66 no DIR; 73 unsafe lock file; 74 DIR vanished mid-lock;
71 OS error; 126/127 exec; 69 etcd unreachable; 76 etcd lease lost;
--release: 0 released; 124/76 it had ended so; 1 no such hold.
)";
  return text;
}

}  // namespace looplock
