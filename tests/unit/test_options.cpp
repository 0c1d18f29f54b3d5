#include "cli/options.hpp"

#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "cli/option_table.hpp"

using looplock::Environment;
using looplock::Fatal;
using looplock::Options;
using looplock::parse_options;

namespace {
constexpr long long kSec = 1'000'000'000LL;  // rows count nanoseconds

// A duration in nanoseconds (a job limit, -w), as the command line gave it.
std::optional<long long> ns(const std::optional<looplock::Duration>& d) {
  return d ? std::optional<long long>(d->count()) : std::nullopt;
}

Environment test_env(std::optional<std::string> agent = std::nullopt) {
  Environment e;
  e.looplock_agent = std::move(agent);
  e.user_name = [] { return std::string("tester"); };
  return e;
}

Options parse(std::vector<std::string> args, const Environment& env = test_env()) {
  args.insert(args.begin(), "looplock");
  return parse_options(args, env);
}

// The Fatal a parse throws (its status and message), or nullopt if it parsed.
struct Failure {
  int status;
  std::string message;
  std::string hint;
};
std::optional<Failure> parse_failure(std::vector<std::string> args, const Environment& env = test_env()) {
  try {
    parse(std::move(args), env);
  } catch (const Fatal& f) {
    return Failure{f.status(), f.what(), f.hint()};
  }
  return std::nullopt;
}

using Args = std::vector<std::string>;

}  // namespace

TEST_CASE("the command after -- is never parsed") {
  Options o = parse({"DIR", "--", "cmd", "--help", "-w", "x"});
  CHECK(o.mode == looplock::Mode::Run);
  CHECK(o.dir == "DIR");
  CHECK(o.command == Args{"cmd", "--help", "-w", "x"});
  CHECK_FALSE(o.shell_form);
  CHECK_FALSE(ns(o.wait.timeout));

  // Everything looplock would reject is the command's business.
  o = parse({"DIR", "--", "cmd", "--", "-c", "--bogus", "-p", "nope", "--inspect", "--version"});
  CHECK(o.mode == looplock::Mode::Run);
  CHECK(o.command == Args{"cmd", "--", "-c", "--bogus", "-p", "nope", "--inspect", "--version"});

  // -c after -- belongs to the command too.
  o = parse({"DIR", "--", "sh", "-c", "exit 3"});
  CHECK(o.command == Args{"sh", "-c", "exit 3"});
  CHECK_FALSE(o.shell_form);
  CHECK(o.identity.operation == "sh");

  // An empty argument of the command is kept as is.
  o = parse({"DIR", "--", "printf", ""});
  CHECK(o.command == Args{"printf", ""});
}

TEST_CASE("defaults") {
  Options o = parse({"DIR", "--", "true"});
  CHECK(o.wait.policy == looplock::Policy::Mutation);
  CHECK_FALSE(ns(o.wait.timeout));
  CHECK(o.wait.conflict_exit_code == 75);
  CHECK(o.wait.skip_exit_code == 0);
  CHECK_FALSE(o.lock.shared);
  CHECK_FALSE(o.lock.close_fd);
  CHECK_FALSE(o.lock.no_fork);
  CHECK_FALSE(ns(o.limits.kill_after));
  CHECK(o.output.verbosity == looplock::Verbosity::Normal);
  CHECK(o.output.log_format == looplock::LogFormat::Text);
  CHECK_FALSE(o.inspect.json);
  CHECK(o.inspect.stale_after == std::chrono::hours(2));
  CHECK(o.identity.agent == "tester");
  CHECK(o.identity.operation == "true");
}

TEST_CASE("timeout spellings") {
  CHECK(ns(parse({"-w", "5", "DIR", "--", "x"}).wait.timeout) == 5 * kSec);
  CHECK(ns(parse({"-w5", "DIR", "--", "x"}).wait.timeout) == 5 * kSec);
  CHECK(ns(parse({"--timeout=5", "DIR", "--", "x"}).wait.timeout) == 5 * kSec);
  CHECK(ns(parse({"--timeout", "0.25", "DIR", "--", "x"}).wait.timeout) == kSec / 4);
  CHECK(ns(parse({"DIR", "-w", "0", "--", "x"}).wait.timeout) == 0);  // options after DIR
  Options o = parse({"-qw", "5", "DIR", "--", "x"});
  CHECK(ns(o.wait.timeout) == 5 * kSec);
  CHECK(o.output.verbosity == looplock::Verbosity::Quiet);
  CHECK(ns(parse({"-p", "monitor", "-w", "2", "DIR", "--", "x"}).wait.timeout) == 2 * kSec);
}

TEST_CASE("an option value that looks like -- or -c is the option's value") {
  Options o = parse({"--operation", "--", "DIR", "--", "x"});
  CHECK(o.identity.operation == "--");
  CHECK(o.dir == "DIR");
  CHECK(o.command == Args{"x"});

  o = parse({"--agent", "-c", "DIR", "--", "x", "y"});
  CHECK(o.identity.agent == "-c");
  CHECK(o.command == Args{"x", "y"});
  CHECK_FALSE(o.shell_form);

  o = parse({"--agent=--", "DIR", "--", "x"});
  CHECK(o.identity.agent == "--");
  CHECK(o.command == Args{"x"});
}

// Every option that takes a value, read from the help text: "-p, --policy
// NAME", "--kill-after DURATION", ...
std::vector<std::pair<std::string, std::string>> value_options_from_help() {
  std::vector<std::pair<std::string, std::string>> out;  // {short or "", long}
  std::regex re(R"((?:^|\s)(?:-([A-Za-z]), )?--([a-z][a-z-]*) [A-Z]+)");
  // The options part only: the usage lines name some options again.
  const std::string& all = looplock::help_text();
  const size_t from = all.find("\nPolicy:\n");
  const std::string help = all.substr(from, all.find("\nExamples:") - from);
  for (auto it = std::sregex_iterator(help.begin(), help.end(), re); it != std::sregex_iterator(); ++it) {
    out.emplace_back((*it)[1].str(), (*it)[2].str());
  }
  return out;
}

TEST_CASE("every value-taking option is classified by the splitter") {
  auto opts = value_options_from_help();
  std::set<std::string> longs;
  for (const auto& [s, l] : opts) longs.insert(l);
  // The help text lists every one the table says takes a value (guards the regex above).
  std::set<std::string> table;
  size_t letters = 0;
  for (const auto& spec : looplock::option_table()) {
    if (spec.value.empty() || spec.help.empty()) continue;
    table.insert(std::string(spec.name));
    letters += spec.letter ? 1 : 0;
  }
  CHECK(table.count("policy") == 1);
  CHECK(longs == table);

  std::vector<std::string> spellings;
  for (const auto& [s, l] : opts) {
    spellings.push_back("--" + l);
    if (!s.empty()) spellings.push_back("-" + s);
  }
  CHECK(spellings.size() == table.size() + letters);
  for (const auto& spelling : spellings) {
    CAPTURE(spelling);
    // The value is "--": if the splitter did not know that the option takes
    // a value, it would cut the command line there instead of at the real --.
    Args args;
    // The cluster's options apply only with --etcd: give one.
    const bool cluster = spelling.starts_with("--etcd-") || spelling == "--lock-name" || spelling == "--ttl";
    Args etcd = cluster ? Args{"--etcd", "https://127.0.0.1:2379"} : Args{};
    // --warn-signal needs --warn-before, which needs --max-time.
    if (spelling == "--warn-signal") etcd = {"--max-time", "5s", "--warn-before", "1s"};
    if (spelling == "--warn-before") etcd = {"--max-time", "5s"};
    // --notify's options need --notify.
    if (spelling.starts_with("--notify-")) etcd = {"--notify", "true"};
    // --tied-to applies to --hold.
    if (spelling == "--tied-to") etcd = {"--hold", "--max-time", "5s"};
    const bool inspect_only = spelling == "--stale-after" || spelling == "--incidents";
    if (inspect_only) {
      args = {"--inspect", spelling, "--", "DIR"};
    } else {
      args = {spelling, "--", "DIR", "--", "x"};
    }
    args.insert(args.begin(), etcd.begin(), etcd.end());
    std::optional<Failure> f = parse_failure(args);
    if (!f) {
      Options o = parse(args);
      CHECK(o.dir == "DIR");
      CHECK(o.command == Args{"x"});
      CHECK((o.identity.agent == "--" || o.identity.operation == "--" || o.metrics_dir == "--" ||
             o.cluster.lock_name == "--" || o.cluster.etcd_cacert == "--" || o.notify.command == "--" ||
             o.notify.on == Args{"--"}));
    } else {
      // The option got "--" as its value and rejected it by name.
      CHECK(f->status == 64);
      CHECK((f->message.find("'--'") != std::string::npos || f->message.find("needs --etcd-") != std::string::npos));
    }
    // The same for "-c" as the value: it must not start a shell command.
    if (!inspect_only) {
      args = {spelling, "-c", "DIR", "--", "x"};
      args.insert(args.begin(), etcd.begin(), etcd.end());
      f = parse_failure(args);
      if (!f) {
        Options o = parse(args);
        CHECK(o.command == Args{"x"});
        CHECK_FALSE(o.shell_form);
      } else {
        CHECK((f->message.find("'-c'") != std::string::npos || f->message.find("needs --etcd-") != std::string::npos));
      }
    }
  }
  // Short value options grouped after a flag.
  auto f = parse_failure({"-qp", "--", "DIR", "--", "x"});
  REQUIRE(f);
  CHECK(f->message.find("'--'") != std::string::npos);
}

TEST_CASE("-c SHELL-COMMAND") {
  Options o = parse({"DIR", "-c", "python3 status.py --tick && echo ok"});
  CHECK(o.shell_form);
  // "--" before the string, so that a string starting with "-" is not an option of sh.
  CHECK(o.command == Args{"/bin/sh", "-c", "--", "python3 status.py --tick && echo ok"});
  CHECK(o.identity.operation == "sh");
  CHECK(parse({"DIR", "-c", "-x"}).command == Args{"/bin/sh", "-c", "--", "-x"});
  o = parse({"-w", "1", "DIR", "-c", "x"});
  CHECK(ns(o.wait.timeout) == kSec);
  CHECK(parse({"--operation", "tick", "DIR", "-c", "x"}).identity.operation == "tick");
}

TEST_CASE("usage errors exit 64") {
  const std::vector<Args> cases = {
      {"--", "x"},                       // missing DIR
      {},                                // nothing at all
      {"DIR"},                           // missing --
      {"DIR", "x"},                      // command without --
      {"DIR", "x", "--", "y"},           // extra positional before --
      {"DIR", "--"},                     // empty command
      {"", "--", "x"},                   // empty DIR
      {"DIR", "-c"},                     // -c without string
      {"DIR", "-c", ""},                 // -c ''
      {"DIR", "-c", "x", "y"},           // extra after -c
      {"DIR", "-c", "x", "--", "y"},     // extra after -c
      {"--bogus", "DIR", "--", "x"},     // unknown option
      {"-Z", "DIR", "--", "x"},          // unknown short option
      {"DIR", "--command", "x"},         // -c has no long form
      {"-p", "nope", "DIR", "--", "x"},  // unknown policy
      {"-p", "", "DIR", "--", "x"},      // empty policy
      {"-p", "single_flight", "-w", "1", "DIR", "--", "x"},
      {"-w", "1", "-p", "single_flight", "DIR", "--", "x"},
      {"-p", "blocking", "-w", "1", "DIR", "--", "x"},
      {"-p", "blocking", "-w", "0", "DIR", "--", "x"},
      {"-F", "-o", "DIR", "--", "x"},
      {"-Fo", "DIR", "--", "x"},
      {"-v", "-q", "DIR", "--", "x"},
      {"--json", "DIR", "--", "x"},               // --json without --inspect
      {"--stale-after", "1h", "DIR", "--", "x"},  // --stale-after without --inspect
      {"--kill-after", "5", "-F", "DIR", "--", "x"},
      {"--kill-after", "soon", "DIR", "--", "x"},
      {"-E", "0", "DIR", "--", "x"},
      {"-E", "256", "DIR", "--", "x"},
      {"-E", "-1", "DIR", "--", "x"},
      {"-E", "abc", "DIR", "--", "x"},
      {"-E", "", "DIR", "--", "x"},
      {"-E", "7x", "DIR", "--", "x"},
      {"-E", " 7", "DIR", "--", "x"},
      {"--skip-exit-code", "256", "DIR", "--", "x"},
      {"--skip-exit-code", "-1", "DIR", "--", "x"},
      {"--skip-exit-code=-1", "DIR", "--", "x"},
      {"-w", "-1", "DIR", "--", "x"},
      {"-w", "abc", "DIR", "--", "x"},
      {"-w", "0x10", "DIR", "--", "x"},
      {"--log-format", "xml", "DIR", "--", "x"},
      {"--inspect", "DIR", "--", "x"},  // --inspect takes no command
      {"--inspect", "DIR", "-c", "x"},
      {"--inspect", "DIR", ""},       // an empty DIR
      {"--check", "DIR", "--", "x"},  // --check without --inspect
      {"--max-time", "5", "-F", "DIR", "--", "x"},
      {"--max-time", "soon", "DIR", "--", "x"},
      {"--inspect", "--max-time", "5", "DIR"},
      {"--metrics-dir", "", "DIR", "--", "x"},
      {"--inspect"},  // --inspect without DIR
      {"--inspect", "--stale-after", "soon", "DIR"},
      {"-w"},  // value missing at the end
  };
  for (const auto& args : cases) {
    std::string shown;
    for (const auto& a : args) shown += "[" + a + "] ";
    CAPTURE(shown);
    auto f = parse_failure(args);
    REQUIRE(f);
    CHECK(f->status == looplock::exit_code::kUsage);
    CHECK_FALSE(f->message.empty());
  }
}

TEST_CASE("usage errors name the cause") {
  auto msg = [](Args a) { return parse_failure(std::move(a)).value().message; };
  CHECK(msg({"--", "x"}).find("missing DIR") != std::string::npos);
  CHECK(msg({"DIR"}).find("missing '--'") != std::string::npos);
  CHECK(msg({"DIR", "--"}).find("no command") != std::string::npos);
  CHECK(msg({"-p", "nope", "DIR", "--", "x"}).find("nope") != std::string::npos);
  CHECK(msg({"-E", "256", "DIR", "--", "x"}).find("1 to 255") != std::string::npos);
  CHECK(msg({"--skip-exit-code", "256", "DIR", "--", "x"}).find("0 to 255") != std::string::npos);
  // A hint on its own line, and the command line is shown how to fix.
  CHECK(parse_failure({"DIR", "x"}).value().hint.find("looplock DIR -- x") != std::string::npos);
}

TEST_CASE("exit code options accept their whole range") {
  CHECK(parse({"-E", "1", "DIR", "--", "x"}).wait.conflict_exit_code == 1);
  CHECK(parse({"-E", "255", "DIR", "--", "x"}).wait.conflict_exit_code == 255);
  CHECK(parse({"--conflict-exit-code=99", "DIR", "--", "x"}).wait.conflict_exit_code == 99);
  CHECK(parse({"--skip-exit-code", "0", "DIR", "--", "x"}).wait.skip_exit_code == 0);
  CHECK(parse({"--skip-exit-code", "255", "DIR", "--", "x"}).wait.skip_exit_code == 255);
  CHECK(parse({"-p", "single_flight", "--skip-exit-code", "3", "DIR", "--", "x"}).wait.skip_exit_code == 3);
}

TEST_CASE("flags and policies") {
  CHECK(parse({"-p", "monitor", "DIR", "--", "x"}).wait.policy == looplock::Policy::Monitor);
  CHECK(parse({"--policy=single_flight", "DIR", "--", "x"}).wait.policy == looplock::Policy::SingleFlight);
  CHECK(parse({"--policy", "blocking", "DIR", "--", "x"}).wait.policy == looplock::Policy::Blocking);
  CHECK(parse({"-p", "mutation", "DIR", "--", "x"}).wait.policy == looplock::Policy::Mutation);
  Options o = parse({"-s", "-o", "-v", "--log-format", "json", "DIR", "--", "x"});
  CHECK(o.lock.shared);
  CHECK(o.lock.close_fd);
  CHECK(o.output.verbosity == looplock::Verbosity::Verbose);
  CHECK(o.output.log_format == looplock::LogFormat::Json);
  o = parse({"-sF", "--log-format=text", "DIR", "--", "x"});
  CHECK(o.lock.shared);
  CHECK(o.lock.no_fork);
  CHECK(o.output.log_format == looplock::LogFormat::Text);
  CHECK(ns(parse({"--kill-after", "2.5s", "DIR", "--", "x"}).limits.kill_after) == 2 * kSec + kSec / 2);
  CHECK(ns(parse({"--kill-after=1m", "-o", "DIR", "--", "x"}).limits.kill_after) == 60 * kSec);
}

TEST_CASE("help, version and inspect modes") {
  CHECK(parse({"--help"}).mode == looplock::Mode::Help);
  CHECK(parse({"-h"}).mode == looplock::Mode::Help);
  CHECK(parse({"--help", "DIR", "--", "x"}).mode == looplock::Mode::Help);
  CHECK(parse({"--version"}).mode == looplock::Mode::Version);
  CHECK(parse({"-V"}).mode == looplock::Mode::Version);
  CHECK(looplock::help_text().find("Usage: looplock") == 0);

  Options o = parse({"--inspect", "DIR"});
  CHECK(o.mode == looplock::Mode::Inspect);
  CHECK(o.dir == "DIR");
  CHECK_FALSE(o.inspect.json);
  CHECK(o.inspect.stale_after == std::chrono::hours(2));
  o = parse({"--inspect", "--json", "--stale-after", "30m", "DIR"});
  CHECK(o.inspect.json);
  CHECK(o.inspect.stale_after == std::chrono::minutes(30));
  CHECK(parse({"DIR", "--inspect"}).mode == looplock::Mode::Inspect);
}

TEST_CASE("agent default: --agent, then $LOOPLOCK_AGENT, then the user name") {
  int asked = 0;
  Environment env;
  env.user_name = [&] {
    ++asked;
    return std::string("alice");
  };
  CHECK(parse({"DIR", "--", "x"}, env).identity.agent == "alice");
  CHECK(asked == 1);

  asked = 0;
  env.looplock_agent = "cron";
  CHECK(parse({"DIR", "--", "x"}, env).identity.agent == "cron");
  CHECK(parse({"--agent", "ci", "DIR", "--", "x"}, env).identity.agent == "ci");
  CHECK(asked == 0);  // only asked when needed

  env.looplock_agent.reset();
  CHECK(parse({"--agent", "ci", "DIR", "--", "x"}, env).identity.agent == "ci");
  CHECK(asked == 0);

  // An empty $LOOPLOCK_AGENT counts as unset.
  env.looplock_agent = "";
  CHECK(parse({"DIR", "--", "x"}, env).identity.agent == "alice");
  env.looplock_agent.reset();

  Environment none;  // no user name function at all
  CHECK_FALSE(parse({"DIR", "--", "x"}, none).identity.agent.empty());

  // Any bytes are accepted.
  std::string odd("a\"b\\c\nd\xff", 8);
  CHECK(parse({"--agent", odd, "--operation", odd, "DIR", "--", "x"}).identity.agent == odd);
}

TEST_CASE("operation default") {
  CHECK(parse({"DIR", "--", "/usr/bin/python3", "/abs/status.py", "--tick"}).identity.operation == "status.py");
  CHECK(parse({"DIR", "-c", "python3 /abs/status.py"}).identity.operation == "sh");
  CHECK(parse({"--operation", "nightly", "DIR", "--", "python3", "x.py"}).identity.operation == "nightly");
}

TEST_CASE("--max-time, --metrics-dir, --check and several --inspect DIRs") {
  CHECK_FALSE(ns(parse({"DIR", "--", "x"}).limits.max_time));
  CHECK(ns(parse({"--max-time", "1.5m", "DIR", "--", "x"}).limits.max_time) == 90 * kSec);
  CHECK_FALSE(ns(parse({"--max-time", "0", "DIR", "--", "x"}).limits.max_time));
  CHECK_FALSE(ns(parse({"--max-time", "inf", "DIR", "--", "x"}).limits.max_time));
  CHECK(parse({"--metrics-dir", "/m", "DIR", "--", "x"}).metrics_dir == "/m");
  CHECK(parse({"DIR", "--", "x"}).metrics_dir.empty());
  looplock::Environment env;
  env.metrics_dir = "/from-env";
  env.user_name = [] { return std::string("u"); };
  CHECK(looplock::parse_options({"looplock", "DIR", "--", "x"}, env).metrics_dir == "/from-env");
  CHECK(looplock::parse_options({"looplock", "--metrics-dir=/m", "DIR", "--", "x"}, env).metrics_dir == "/m");
  Options o = parse({"--inspect", "--check", "A", "B", "C"});
  CHECK(o.inspect.check);
  CHECK(o.inspect.dirs == Args{"A", "B", "C"});
  CHECK(o.dir == "A");
}

TEST_CASE("--kill-after 0 and inf mean never; -w inf waits without limit") {
  auto signal_kill_after = [](const Options& o) { return ns(o.limits.kill_after); };
  auto max_time_kill_after = [](const Options& o) { return ns(o.limits.max_time_kill_after); };
  CHECK_FALSE(signal_kill_after(parse({"DIR", "--", "x"})));
  CHECK_FALSE(signal_kill_after(parse({"--kill-after", "0", "DIR", "--", "x"})));
  CHECK_FALSE(signal_kill_after(parse({"--kill-after", "inf", "DIR", "--", "x"})));
  CHECK(signal_kill_after(parse({"--kill-after", "1e-3", "DIR", "--", "x"})) == kSec / 1000);
  // --max-time's TERM is followed by KILL after 5 s unless told otherwise.
  CHECK(max_time_kill_after(parse({"DIR", "--", "x"})) == 5 * kSec);
  CHECK(max_time_kill_after(parse({"--kill-after", "2", "DIR", "--", "x"})) == 2 * kSec);
  CHECK_FALSE(max_time_kill_after(parse({"--kill-after", "0", "DIR", "--", "x"})));
  auto o = parse({"-w", "inf", "DIR", "--", "x"});
  CHECK(looplock::wait_plan(o.wait.policy, o.wait.timeout).kind == looplock::WaitPlan::Kind::Unbounded);
  o = parse({"-w", ".5", "DIR", "--", "x"});
  CHECK(looplock::wait_plan(o.wait.policy, o.wait.timeout).kind == looplock::WaitPlan::Kind::Bounded);
  CHECK(looplock::wait_plan(o.wait.policy, o.wait.timeout).timeout.count() == kSec / 2);
}

TEST_CASE("derive_operation") {
  using looplock::derive_operation;
  CHECK(derive_operation({"status.py"}) == "status.py");
  CHECK(derive_operation({"/usr/local/bin/tool", "--secret=x"}) == "tool");
  CHECK(derive_operation({"./monitor.sh"}) == "monitor.sh");
  CHECK(derive_operation({"/usr/bin/python3", "/abs/status.py", "--tick"}) == "status.py");
  CHECK(derive_operation({"python3", "-u", "status.py"}) == "status.py");
  CHECK(derive_operation({"python3.11", "-W", "ignore", "scripts/s.py"}) == "s.py");
  CHECK(derive_operation({"python3", "-X", "dev", "s.py"}) == "s.py");
  CHECK(derive_operation({"python3", "-c", "code"}) == "python3");
  CHECK(derive_operation({"python3", "-m", "mod"}) == "python3");
  CHECK(derive_operation({"python3", "--", "/abs/x.py"}) == "x.py");
  CHECK(derive_operation({"python3"}) == "python3");
  CHECK(derive_operation({"python3", "-"}) == "python3");
  CHECK(derive_operation({"pypy3", "run.py"}) == "run.py");
  CHECK(derive_operation({"sh", "script.sh"}) == "script.sh");
  CHECK(derive_operation({"sh", "-c", "x"}) == "sh");
  CHECK(derive_operation({"/bin/bash", "-o", "pipefail", "run.sh"}) == "run.sh");
  CHECK(derive_operation({"bash", "-e", "run.sh"}) == "run.sh");
  CHECK(derive_operation({"bash", "-e", "-c", "x"}) == "bash");
  CHECK(derive_operation({"node", "--require", "x", "app.js"}) == "app.js");
  CHECK(derive_operation({"node", "-r", "x", "app.js"}) == "app.js");
  CHECK(derive_operation({"node", "-e", "code"}) == "node");
  CHECK(derive_operation({"perl", "-I", "lib", "x.pl"}) == "x.pl");
  CHECK(derive_operation({"ruby", "-e", "code"}) == "ruby");
  CHECK(derive_operation({"env", "python3", "x.py"}) == "env");
  CHECK(derive_operation({"dir/"}) == "dir");
  CHECK(derive_operation({}) == "command");
  CHECK(derive_operation({""}) == "command");
}

TEST_CASE("derive_operation never returns a path, another argument or an empty name") {
  using looplock::derive_operation;
  const std::vector<Args> commands = {
      {"/"},
      {"//"},
      {"/usr/bin/"},
      {"python3", "/"},
      {"python3", "a/"},
      {"python3", "--", "/"},
      {"sh", "//"},
      {"node", "--", "dir/"},
      {"/opt/x/python3", "-W", "/etc/x", "/srv/a/b/c.py"},
      {"python3", "-c", "import os; print('/etc/SECRET')"},
      {"sh", "-c", "curl -u user:SECRET https://example.com/"},
      {"mysql", "--password=SECRET"},
      {"node", "-e", "SECRET"},
      // Short options grouped with the inline-code option: the code is not a script.
      {"sh", "-ec", "echo SECRET"},
      {"bash", "-xc", "echo SECRET"},
      {"python3", "-uc", "print('SECRET')"},
      {"python3", "-Bm", "SECRET"},
      {"perl", "-we", "print 'SECRET'"},
  };
  for (const auto& c : commands) {
    std::string shown;
    for (const auto& a : c) shown += "[" + a + "] ";
    CAPTURE(shown);
    std::string op = derive_operation(c);
    CAPTURE(op);
    CHECK_FALSE(op.empty());
    CHECK(op.find('/') == std::string::npos);
    CHECK(op.find("SECRET") == std::string::npos);
  }
}

TEST_CASE("derive_operation: shell options with + take their value too") {
  // sh/bash accept +o NAME (unset an option) and +e like -o NAME and -e.
  CHECK(looplock::derive_operation({"bash", "+o", "posix", "run.sh"}) == "run.sh");
  CHECK(looplock::derive_operation({"sh", "+e", "run.sh"}) == "run.sh");
}

TEST_CASE("--jitter: at most 24h, no inf") {
  CHECK(*parse({"--jitter", "24h", "DIR", "--", "x"}).once_per.jitter == std::chrono::hours(24));
  CHECK(*parse({"--jitter", "20s", "DIR", "--", "x"}).once_per.jitter == std::chrono::seconds(20));
  CHECK(!parse({"--jitter", "0", "DIR", "--", "x"}).once_per.jitter);
  for (const char* text : {"inf", "1e12", "24.1h", "2d"}) {
    CAPTURE(text);
    auto f = parse_failure({"--jitter", text, "DIR", "--", "x"});
    REQUIRE(f);
    CHECK(f->status == 64);
    CHECK(f->message == "invalid --jitter '" + std::string(text) + "': at most 24h");
  }
  // The deadlines keep inf.
  for (const char* opt : {"-w", "--max-time", "--kill-after", "--once-per"}) {
    CAPTURE(opt);
    CHECK(!parse_failure({opt, "inf", "DIR", "--", "x"}));
  }
  CHECK(!parse_failure({"--inspect", "--stale-after", "inf", "DIR"}));
}

TEST_CASE("cluster options: --etcd, --lock-name, --ttl") {
  const std::string E = "http://127.0.0.1:2379";
  Options o = parse({"--etcd", E, "DIR", "--", "x"});
  CHECK(o.cluster.etcd == E);
  CHECK(o.cluster.lock_name.empty());  // the loop dir's base name, resolved at run time
  CHECK(o.cluster.ttl_s == 10);
  o = parse({"--etcd", E, "--lock-name", "nightly", "--ttl", "3", "DIR", "--", "x"});
  CHECK(o.cluster.lock_name == "nightly");
  CHECK(o.cluster.ttl_s == 3);
  // The default endpoints come from $LOOPLOCK_ETCD.
  Environment env = test_env();
  env.looplock_etcd = E;
  CHECK(parse({"DIR", "--", "x"}, env).cluster.etcd == E);
  CHECK(parse({"--etcd", "http://h:1", "DIR", "--", "x"}, env).cluster.etcd == "http://h:1");
  CHECK(parse({"DIR", "--", "x"}).cluster.etcd.empty());

  for (Args bad :
       {Args{"--etcd", "127.0.0.1:2379", "DIR", "--", "x"}, Args{"--etcd", "", "DIR", "--", "x"},
        Args{"--etcd", "ftp://h:1", "DIR", "--", "x"}, Args{"--lock-name", "n", "DIR", "--", "x"},
        Args{"--ttl", "5", "DIR", "--", "x"}, Args{"--etcd", E, "--ttl", "1", "DIR", "--", "x"},
        Args{"--etcd", E, "--ttl", "2.5", "DIR", "--", "x"}, Args{"--etcd", E, "--lock-name", "", "DIR", "--", "x"},
        Args{"--etcd", E, "--lock-name", "a\nb", "DIR", "--", "x"}, Args{"--etcd", E, "-s", "DIR", "--", "x"},
        Args{"--etcd", E, "-F", "DIR", "--", "x"}}) {
    CAPTURE(bad);
    auto f = parse_failure(bad);
    REQUIRE(f);
    CHECK(f->status == 64);
  }
  auto f = parse_failure({"--etcd", E, "-s", "DIR", "--", "x"});
  CHECK(f->message.find("shared cluster locks are not supported") != std::string::npos);

  // --ttl is a duration of whole seconds, as looplock prints it ("TTL 10.0s").
  for (auto [text, ttl] : {std::pair{"10", 10}, std::pair{"10s", 10}, std::pair{"10.0s", 10}, std::pair{"1m", 60},
                           std::pair{"2", 2}, std::pair{"1d", 86400}, std::pair{"2000ms", 2}}) {
    CAPTURE(text);
    CHECK(parse({"--etcd", E, "--ttl", text, "DIR", "--", "x"}).cluster.ttl_s == ttl);
  }
  for (const char* text : {"10.5", "2500ms", "1.5s", "inf", "2d", "0", "1s", "x"}) {
    CAPTURE(text);
    f = parse_failure({"--etcd", E, "--ttl", text, "DIR", "--", "x"});
    REQUIRE(f);
    CHECK(f->message == "invalid --ttl '" + std::string(text) + "': expected whole seconds from 2 to 86400 (10, 10s, 1m)");
  }
  CHECK(parse_failure({"--etcd", E, "--ttl", "10.5", "DIR", "--", "x"})->hint == "etcd's leases count in whole seconds.");
  // -s without --etcd, and $LOOPLOCK_ETCD with -s, as told.
  CHECK(parse({"-s", "DIR", "--", "x"}).lock.shared);
  CHECK(parse_failure({"-s", "DIR", "--", "x"}, env));
  // --inspect takes --etcd (to name the cluster holder).
  CHECK(parse({"--inspect", "--etcd", E, "DIR"}).cluster.etcd == E);
}

TEST_CASE("the lease's kill-after: a default that fits the TTL; 0 or too long is a usage error") {
  // In nanoseconds, as the rows count.
  auto lease_kill_after_ns = [](std::optional<long long> given, int ttl, std::string_view text = {}) {
    return looplock::lease_kill_after(given ? std::optional(looplock::Duration(*given)) : std::nullopt, ttl, text)
        .count();
  };
  CHECK(lease_kill_after_ns(std::nullopt, 3) == 500'000'000LL);
  CHECK(lease_kill_after_ns(std::nullopt, 10) == 1'666'666'666LL);
  CHECK(lease_kill_after_ns(std::nullopt, 60) == 5 * kSec);
  CHECK(lease_kill_after_ns(kSec, 3) == kSec);
  CHECK(lease_kill_after_ns(5 * kSec, 10) == 5 * kSec);
  CHECK(lease_kill_after_ns(1'770'000'000LL, 3) == 1'770'000'000LL);  // the most at --ttl 3
  for (auto [given, ttl] : {std::pair{1'780'000'000LL, 3}, std::pair{0LL, 3}, std::pair{5 * kSec, 3},
                            std::pair{7 * kSec, 10}, std::pair{2 * kSec, 2}}) {
    CAPTURE(given);
    CAPTURE(ttl);
    try {
      lease_kill_after_ns(given, ttl, "T");
      FAIL("no usage error");
    } catch (const Fatal& f) {
      CHECK(f.status() == 64);
      CHECK(std::string(f.what()).starts_with("invalid --kill-after 'T' with --ttl " + std::to_string(ttl) + ": "));
      CHECK(f.hint().starts_with("Give --kill-after "));
    }
  }
  // Through the options: --ttl 3 works with the defaults; 0 is refused with --etcd only.
  const std::string E = "http://127.0.0.1:2379";
  CHECK(parse({"--etcd", E, "--ttl", "3", "DIR", "--", "x"}).cluster.lease_kill_after.count() == 500'000'000LL);
  CHECK(parse({"--etcd", E, "--ttl", "3", "--kill-after", "1", "DIR", "--", "x"}).cluster.lease_kill_after.count() ==
        kSec);
  auto f = parse_failure({"--etcd", E, "--ttl", "3", "--kill-after", "5s", "DIR", "--", "x"});
  REQUIRE(f);
  CHECK(f->status == 64);
  CHECK(f->message ==
        "invalid --kill-after '5s' with --ttl 3: TERM would leave too little of the lease to renew it "
        "(a quarter of the TTL must remain to ride out an etcd outage)");
  CHECK(f->hint == "Give --kill-after 1.7s or less (default at --ttl 3: 500ms), or a longer --ttl.");
  f = parse_failure({"--etcd", E, "--kill-after", "0", "DIR", "--", "x"});
  REQUIRE(f);
  CHECK(f->message.find("must be killable before its lease expires") != std::string::npos);
  CHECK_FALSE(parse_failure({"--kill-after", "0", "DIR", "--", "x"}));
}

TEST_CASE("cluster TLS and authentication options") {
  const std::string S = "https://127.0.0.1:2379";
  const std::string P = "http://127.0.0.1:2379";
  Options o =
      parse({"--etcd", S, "--etcd-cacert", "ca.pem", "--etcd-cert", "c.pem", "--etcd-key", "k.pem", "DIR", "--", "x"});
  CHECK(o.cluster.etcd_cacert == "ca.pem");
  CHECK(o.cluster.etcd_cert == "c.pem");
  CHECK(o.cluster.etcd_key == "k.pem");
  // Defaults from the environment, for https:// endpoints only.
  Environment env = test_env();
  env.looplock_etcd_cacert = "/etc/ca.pem";
  env.looplock_etcd_client_cert = "/etc/c.pem";
  env.looplock_etcd_client_key = "/etc/k.pem";
  o = parse({"--etcd", S, "DIR", "--", "x"}, env);
  CHECK(o.cluster.etcd_cacert == "/etc/ca.pem");
  CHECK(o.cluster.etcd_key == "/etc/k.pem");
  CHECK(parse({"--etcd", P, "DIR", "--", "x"}, env).cluster.etcd_cacert.empty());
  CHECK(parse({"--etcd", S, "--etcd-cacert", "mine.pem", "DIR", "--", "x"}, env).cluster.etcd_cacert == "mine.pem");
  // A user, with the password from the environment (never from the command line).
  env.looplock_etcd_password = "s3cret";
  o = parse({"--etcd", S, "--etcd-user", "loop", "DIR", "--", "x"}, env);
  CHECK(o.cluster.etcd_user == "loop");
  CHECK(o.cluster.etcd_password == std::optional<std::string>("s3cret"));
  o = parse({"--etcd", S, "--etcd-user", "loop", "--etcd-password-file", "/run/pw", "DIR", "--", "x"});
  CHECK(o.cluster.etcd_password_file == "/run/pw");
  CHECK(parse({"--etcd", S, "DIR", "--", "x"}, env).cluster.etcd_password == std::nullopt);  // no user: not kept
  CHECK(parse({"--inspect", "--etcd", S, "--etcd-user", "loop", "DIR"}, env).cluster.etcd_user == "loop");

  for (Args bad : {Args{"--etcd-cacert", "ca.pem", "DIR", "--", "x"},
                   Args{"--etcd", P, "--etcd-cacert", "ca.pem", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-cert", "c.pem", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-key", "k.pem", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-cacert", "", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-user", "loop", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-user", "", "DIR", "--", "x"},
                   Args{"--etcd-user", "loop", "--etcd-password-file", "f", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-password-file", "f", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-user", "loop", "--etcd-password", "s3cret", "DIR", "--", "x"},
                   Args{"--etcd", S, "--etcd-user", "loop", "--etcd-password=s3cret", "DIR", "--", "x"}}) {
    CAPTURE(bad);
    auto f = parse_failure(bad);
    REQUIRE(f);
    CHECK(f->status == 64);
    CHECK(f->message.find("s3cret") == std::string::npos);
    CHECK(f->hint.find("s3cret") == std::string::npos);
  }
  auto f = parse_failure({"--etcd", S, "--etcd-user", "loop", "--etcd-password=s3cret", "DIR", "--", "x"});
  CHECK(f->message.find("visible to every user") != std::string::npos);
  f = parse_failure({"--etcd", S, "--etcd-user", "loop", "DIR", "--", "x"});
  CHECK(f->hint.find("$LOOPLOCK_ETCD_PASSWORD") != std::string::npos);
}

TEST_CASE("flock(1) habits: -n is -w 0 under the policy in force, -x the default; -u and 'flock N' are pointed") {
  Options o = parse({"-n", "DIR", "--", "x"});
  CHECK(ns(o.wait.timeout) == 0);
  CHECK(o.wait.policy == looplock::Policy::Mutation);
  CHECK(ns(parse({"--nonblock", "-p", "monitor", "DIR", "--", "x"}).wait.timeout) == 0);
  CHECK(ns(parse({"-xn", "DIR", "--", "x"}).wait.timeout) == 0);
  CHECK_FALSE(parse({"-x", "DIR", "--", "x"}).lock.shared);
  CHECK_FALSE(ns(parse({"--exclusive", "DIR", "--", "x"}).wait.timeout));
  auto f = parse_failure({"-n", "-p", "single_flight", "DIR", "--", "x"});
  REQUIRE(f);
  CHECK(f->message == "-n/--nonblock does not apply to policy single_flight");
  CHECK(f->hint.find("-p single_flight -q") != std::string::npos);
  CHECK(parse_failure({"-n", "-p", "blocking", "DIR", "--", "x"}));
  CHECK(parse_failure({"-n", "-w", "1", "DIR", "--", "x"}).value().message ==
        "-n/--nonblock and -w/--timeout cannot be combined");
  CHECK(parse_failure({"-s", "-x", "DIR", "--", "x"}).value().message ==
        "-s/--shared and -x/--exclusive cannot be combined");
  f = parse_failure({"-u", "DIR", "--", "x"});
  REQUIRE(f);
  CHECK(f->status == looplock::exit_code::kUsage);
  CHECK(f->message.starts_with("-u/--unlock is not an option"));
  CHECK(f->hint.find("$LOOPLOCK_FD") != std::string::npos);
  f = parse_failure({"9"});
  REQUIRE(f);
  CHECK(f->message.find("not as a descriptor") != std::string::npos);
  CHECK(f->hint.find("looplock [OPTIONS] DIR -- COMMAND") != std::string::npos);
}

TEST_CASE("--agent '' and --operation '' are usage errors") {
  for (const char* name : {"--agent", "--operation"}) {
    CAPTURE(name);
    auto f = parse_failure({name, "", "DIR", "--", "x"});
    REQUIRE(f);
    CHECK(f->status == looplock::exit_code::kUsage);
    CHECK(f->message == "invalid " + std::string(name) + " '': expected a non-empty " +
                            (std::string(name) == "--agent" ? "ID" : "NAME"));
  }
  // An empty $LOOPLOCK_AGENT is no agent: the user name is the default.
  CHECK(parse({"DIR", "--", "x"}, test_env("")).identity.agent == "tester");
}

TEST_CASE("--inspect without DIR shows the --inspect synopsis") {
  auto f = parse_failure({"--inspect"});
  REQUIRE(f);
  CHECK(f->message == "missing DIR");
  CHECK(f->hint == "Give the loop directories: looplock --inspect [--json] [--check] DIR...");
  CHECK(parse_failure({"--", "x"}).value().hint.find("DIR -- COMMAND") != std::string::npos);
}

TEST_CASE("the option table: every option is a usage error where it does not apply, and --help lists it") {
  const std::string& help = looplock::help_text();
  for (const auto& spec : looplock::option_table()) {
    const std::string name(spec.name);
    CAPTURE(name);
    if (name == "help" || name == "version" || name == "inspect" || name == "unlock" || name == "hold" ||
        name == "release")
      continue;
    Args given = {"--" + name};
    if (!spec.value.empty()) given.push_back(name == "etcd" ? "http://127.0.0.1:2379" : "1");
    const Args etcd = spec.needs_etcd ? Args{"--etcd", "http://127.0.0.1:2379"} : Args{};
    auto with = [&](Args head, Args tail) {
      Args a = std::move(head);
      a.insert(a.end(), etcd.begin(), etcd.end());
      a.insert(a.end(), given.begin(), given.end());
      a.insert(a.end(), tail.begin(), tail.end());
      return a;
    };
    const std::string shown = looplock::option_shown(spec);
    if (!(spec.applies & looplock::kInInspect)) {
      auto f = parse_failure(with({"--inspect"}, {"DIR"}));
      REQUIRE(f);
      CHECK(f->status == 64);
      CHECK(f->message == shown + " does not apply to --inspect");
    }
    if (!(spec.applies & looplock::kInRun)) {
      auto f = parse_failure(with({}, {"DIR", "--", "x"}));
      REQUIRE(f);
      CHECK(f->message == shown + (spec.applies == looplock::kInRelease ? " only applies to --release"
                                                                        : " only applies to --inspect"));
    }
    if (spec.needs_etcd) {
      Args a = given;
      a.insert(a.begin(), {"--inspect"});
      if (!(spec.applies & looplock::kInInspect)) a = Args{given.begin(), given.end()};
      a.push_back("DIR");
      if (!(spec.applies & looplock::kInInspect)) a.insert(a.end(), {"--", "x"});
      auto f = parse_failure(a);
      REQUIRE(f);
      CHECK(f->message == shown + " applies only with --etcd ENDPOINTS");
    }
    if (spec.not_with_no_fork) {
      auto f = parse_failure(with({"-F"}, {"DIR", "--", "x"}));
      REQUIRE(f);
      CHECK(f->message.starts_with(shown + " needs looplock to stay the command's parent"));
    }
    // --help lists it in its section: after the section's title, before the next one.
    if (spec.help.empty()) continue;
    const std::string title = std::string(looplock::section_title(spec.section)) + ":\n";
    const size_t at = help.find(title);
    REQUIRE(at != std::string::npos);
    const size_t next = help.find(":\n", at + title.size());
    const size_t line = help.find("--" + name + (spec.value.empty() ? " " : " " + std::string(spec.value)), at);
    CHECK(line != std::string::npos);
    CHECK(line < (next == std::string::npos ? help.size() : help.rfind('\n', next)));
  }
}

TEST_CASE("options that exclude each other, from the table") {
  for (const auto& c : looplock::option_conflicts()) {
    CAPTURE(std::string(c.a));
    Args a;
    for (std::string_view n : {c.a, c.b}) {
      a.push_back("--" + std::string(n));
      if (!looplock::find_option(n)->value.empty()) a.push_back(n == "etcd" ? "http://127.0.0.1:2379" : "1");
    }
    a.insert(a.end(), {"DIR", "--", "x"});
    auto f = parse_failure(a);
    REQUIRE(f);
    CHECK(f->message.starts_with(looplock::option_shown(*looplock::find_option(c.a)) + " and " +
                                 looplock::option_shown(*looplock::find_option(c.b)) + " cannot be combined"));
  }
}

namespace {

// What a parse came to, as text: every field of Options, or the usage error.
std::string outcome_of(const Args& args, bool declare_all) {
  Args argv = args;
  argv.insert(argv.begin(), "looplock");
  Environment env = test_env();
  env.looplock_etcd_password = "secret";
  try {
    const Options o = parse_options(argv, env, declare_all);
    std::string s;
    auto add = [&](const std::string& k, const std::string& v) { s += k + "=" + v + ";"; };
    auto opt = [](const std::optional<long long>& v) { return v ? std::to_string(*v) : std::string("-"); };
    auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& x : v) out += "[" + x + "]";
      return out;
    };
    add("mode", std::to_string(static_cast<int>(o.mode)));
    add("dirs", list(o.inspect.dirs));
    add("command", list(o.command));
    add("shell", std::to_string(o.shell_form));
    add("policy", std::to_string(static_cast<int>(o.wait.policy)));
    add("timeout", opt(ns(o.wait.timeout)));
    add("E", std::to_string(o.wait.conflict_exit_code) + "/" + std::to_string(o.wait.skip_exit_code));
    add("flags", std::to_string(o.lock.shared) + std::to_string(o.lock.close_fd) + std::to_string(o.lock.no_fork) +
                     std::to_string(o.inspect.json) + std::to_string(o.inspect.check));
    add("kill", opt(ns(o.limits.kill_after)) + "/" + opt(ns(o.limits.max_time_kill_after)));
    add("max",
        opt(ns(o.limits.max_time)) + "/" + opt(ns(o.limits.warn_before)) + "/" + std::to_string(o.limits.warn_signal));
    add("once", opt(ns(o.once_per.period)) + "/" + opt(ns(o.once_per.jitter)));
    add("metrics", o.metrics_dir);
    add("who", o.identity.agent + "/" + o.identity.operation);
    add("out", std::to_string(static_cast<int>(o.output.verbosity)) + std::to_string(static_cast<int>(o.output.log_format)));
    add("etcd", o.cluster.etcd + "/" + std::to_string(o.cluster.endpoints.size()) + "/" + o.cluster.lock_name + "/" +
                    std::to_string(o.cluster.ttl_s) + "/" + std::to_string(o.cluster.lease_kill_after.count()));
    add("tls", o.cluster.etcd_cacert + "/" + o.cluster.etcd_cert + "/" + o.cluster.etcd_key + "/" + o.cluster.etcd_user + "/" +
                   o.cluster.etcd_password_file + "/" + o.cluster.etcd_password.value_or("-"));
    add("inspect", std::to_string(o.inspect.stale_after.count()) + "/" + std::to_string(o.inspect.incidents));
    return s;
  } catch (const Fatal& f) {
    return "error " + std::to_string(f.status()) + ": " + f.what() + " | " + f.hint();
  }
}

}  // namespace

TEST_CASE("only the options argv names are declared to cxxopts, with the same result as the whole table") {
  std::vector<Args> cases = {
      {"DIR", "--", "x"},
      {"-", "--", "x"},
      {"-5", "DIR", "--", "x"},
      {"-+", "DIR", "--", "x"},
      {"--", "x"},
      {"DIR", "x", "--", "y"},
      {"--bogus", "DIR", "--", "x"},
      {"--bogus=1", "DIR", "--", "x"},
      {"-qZ", "DIR", "--", "x"},
      {"-qw", "1", "DIR", "--", "x"},
      {"-qw1", "DIR", "--", "x"},
      {"-wq", "DIR", "--", "x"},
      {"-w"},
      {"--agent", "--quiet", "DIR", "--", "x"},
      {"--agent", "-q", "DIR", "--", "x"},
      {"--agent=-q", "DIR", "--", "x"},
      {"--quiet=1", "DIR", "--", "x"},
      {"--polic", "mutation", "DIR", "--", "x"},
      {"--policy-x", "DIR", "--", "x"},
      {"-p", "monitor", "-n", "-v", "--log-format", "json", "DIR", "-c", "true"},
      {"--inspect", "--json", "--check", "--incidents", "3", "A", "B"},
      {"--etcd", "http://127.0.0.1:2379", "--ttl", "3", "--kill-after", "0.3", "DIR", "--", "x"},
      {"--etcd=http://127.0.0.1:2379", "--etcd-user", "u", "DIR", "--", "x"},
      {"--etcd", "https://127.0.0.1:2379", "--etcd-cacert", "ca", "--etcd-cert", "c", "--etcd-key", "k", "DIR", "--",
       "x"},
      {"--max-time", "5", "--warn-before", "1", "--warn-signal", "HUP", "DIR", "--", "x"},
      {"--once-per", "4m", "--jitter", "10s", "--operation", "tick", "DIR", "--", "x"},
      {"-h"},
      {"--version", "DIR"},
      {"-Fo", "DIR", "--", "x"},
      {"-sx", "DIR", "--", "x"},
      {"-u", "DIR", "--", "x"},
  };
  // Every option of the table, alone and after -q, with a value its kind takes.
  for (const auto& spec : looplock::option_table()) {
    const std::string v = spec.value == "DURATION" ? "1s"
                          : spec.value == "N"      ? "3"
                          : spec.value == "ENDPOINTS" ? "http://127.0.0.1:2379"
                          : spec.value == "SIG"    ? "USR2"
                          : spec.value == "SECONDS" ? "5"
                                                    : "x";
    Args a = {"--" + std::string(spec.name)};
    if (!spec.value.empty()) a.push_back(v);
    for (Args head : {Args{}, Args{"-q"}, Args{"--inspect"}, Args{"--etcd", "http://127.0.0.1:2379"}}) {
      Args c = head;
      c.insert(c.end(), a.begin(), a.end());
      cases.push_back(c);
      cases.back().insert(cases.back().end(), {"DIR", "--", "x"});
      if (head == Args{"--inspect"}) cases.push_back(c), cases.back().push_back("DIR");
    }
    if (spec.letter) {
      Args s = {"-" + std::string(1, spec.letter)};
      if (!spec.value.empty()) s.push_back(v);
      s.insert(s.end(), {"DIR", "--", "x"});
      cases.push_back(s);
    }
  }
  for (const auto& args : cases) {
    std::string shown;
    for (const auto& a : args) shown += "[" + a + "] ";
    CAPTURE(shown);
    CHECK(outcome_of(args, false) == outcome_of(args, true));
  }
}

TEST_CASE("--holders N: 2 to 1024, not with -s, --once-per or -F") {
  CHECK(parse({"DIR", "--", "x"}).lock.holders == 0);
  CHECK(parse({"--holders", "3", "DIR", "--", "x"}).lock.holders == 3);
  CHECK(parse({"--holders=1024", "DIR", "--", "x"}).lock.holders == 1024);
  for (const char* bad : {"1", "0", "1025", "-2", "3x", ""}) {
    CAPTURE(bad);
    auto f = parse_failure({"--holders", bad, "DIR", "--", "x"});
    REQUIRE(f);
    CHECK(f->status == looplock::exit_code::kUsage);
    CHECK(f->message == "invalid --holders '" + std::string(bad) + "': expected a number from 2 to 1024");
  }
  CHECK(parse_failure({"--holders", "3", "-s", "DIR", "--", "x"})
            .value()
            .message.starts_with("--holders and -s/--shared cannot be combined"));
  CHECK(parse_failure({"--holders", "3", "--once-per", "5m", "DIR", "--", "x"})
            .value()
            .message.starts_with("--holders and --once-per cannot be combined"));
  CHECK(parse_failure({"--holders", "3", "-F", "DIR", "--", "x"}).value().message.starts_with("--holders needs"));
  CHECK(parse_failure({"--holders", "3", "--inspect", "DIR"}).value().message ==
        "--holders does not apply to --inspect");
}
