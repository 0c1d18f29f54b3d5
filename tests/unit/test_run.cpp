#include "run/run.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <deque>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"
#include "testutil.hpp"

using looplock::Conclusion;
using looplock::Exit;
using looplock::JobEnd;
using looplock::RunOutcome;

namespace {

JobEnd exited(int status) {
  JobEnd j;
  j.status = status << 8;  // a wait status: exited with `status`
  return j;
}

JobEnd killed_by(int sig) {
  JobEnd j;
  j.status = sig;
  return j;
}

}  // namespace

TEST_CASE("the conclusion of a job that ran: the command's own status, or looplock's, in one order") {
  struct Row {
    const char* what;
    JobEnd job;
    bool lost;
    bool intact;
    Exit::Kind kind;
    int value;
    RunOutcome outcome;
  };
  JobEnd max_time = exited(143);
  max_time.ended_by = JobEnd::EndedBy::MaxTime;
  const Row rows[] = {
      {"success", exited(0), false, true, Exit::Kind::LikeWaitStatus, 0, RunOutcome::Success},
      {"failure", exited(3), false, true, Exit::Kind::LikeWaitStatus, 3 << 8, RunOutcome::Failure},
      {"signal", killed_by(SIGTERM), false, true, Exit::Kind::LikeWaitStatus, SIGTERM, RunOutcome::Signaled},
      {"vanished under a success", exited(0), false, false, Exit::Kind::ExitStatus, 74, RunOutcome::Error},
      {"vanished under a failure: its status wins", exited(3), false, false, Exit::Kind::LikeWaitStatus, 3 << 8,
       RunOutcome::Failure},
      {"max-time", max_time, false, true, Exit::Kind::ExitStatus, 124, RunOutcome::MaxTime},
      {"max-time beats vanished", max_time, false, false, Exit::Kind::ExitStatus, 124, RunOutcome::MaxTime},
      {"lease lost beats max-time", max_time, true, false, Exit::Kind::ExitStatus, 76, RunOutcome::LeaseLost},
      {"lease lost", exited(0), true, true, Exit::Kind::ExitStatus, 76, RunOutcome::LeaseLost},
  };
  for (const Row& r : rows) {
    CAPTURE(r.what);
    const Conclusion c = looplock::conclude(r.job, r.lost, r.intact);
    CHECK(c.exit.kind == r.kind);
    CHECK(c.exit.value == r.value);
    CHECK(c.outcome == r.outcome);
  }
}

// --- Run with a fake lock and a fake job: the script's paths, without processes

namespace {

using namespace looplock;

// A lock that answers as told and remembers what was asked of it: a third
// kind of lock, written as one class and given to Run by a factory.
class FakeLock final : public Lock {
public:
  struct Script {
    std::deque<Acquisition> answers{Acquisition::Acquired};  // one per acquire(); the last repeats
    std::optional<RunEntry> ledger_entry;                    // its ledger's entry (a ledger when set)
    bool lease_lost_at_release = false;                      // the job lost this lock's lease
    bool replaced_at_release = false;                        // the release finds the lock file replaced
    bool ledger_locked_only = false;  // its ledger shows the entry only to a locked read (a run that just ended)
    std::string log_path;             // where the run's lines go: abandon() notes whether the skip was said yet
  };
  struct Calls {
    int acquire = 0, exported = 0, released = 0, abandoned = 0, starts = 0, ends = 0;
    std::optional<int> end_status;  // the exit status the last recorded end carried
    bool skip_said_before_let_go = false;
  };

  FakeLock(Script script, Calls& calls) : s_(std::move(script)), calls_(calls) {}

  Acquisition acquire(const WaitPlan& /*plan*/, looplock::Instant /*start*/) override {
    ++calls_.acquire;
    const Acquisition a = s_.answers.front();
    if (s_.answers.size() > 1) s_.answers.pop_front();
    return a;
  }
  Blocker blocker() const override {
    Blocker b;
    b.what = "the fake lock";
    b.who = "pid 42 (a fake holder)";
    b.inspect_hint = "looplock --inspect FAKE";
    b.holders.pids = {42};
    b.fields["fake"] = Json{{"kind", "fake"}};
    return b;
  }
  void export_to(CommandSpec& spec) override {
    ++calls_.exported;
    spec.env.push_back("FAKE_LOCK=held");
  }
  void release(Ending& ending) override {
    ++calls_.released;
    if (s_.lease_lost_at_release) ending.lost = true;
    if (s_.replaced_at_release) ending.intact = false;
  }
  void abandon() override {
    ++calls_.abandoned;
    if (!s_.log_path.empty()) {
      calls_.skip_said_before_let_go =
          testutil::slurp(s_.log_path).value_or("").find("noop-already-run") != std::string::npos;
    }
  }
  Ledger* ledger() override { return s_.ledger_entry ? &ledger_ : nullptr; }

private:
  // Its run ledger: the scripted entry, and a count of what was recorded.
  class FakeLedger final : public Ledger {
  public:
    FakeLedger(const Script& s, Calls& calls) : s_(s), calls_(calls) {}
    LedgerLook look(const std::string& /*operation*/, bool locked) override {
      if (s_.ledger_locked_only && !locked) return {};
      return {.entry = s_.ledger_entry};
    }
    void record_start(const RunEntry& /*entry*/) override { ++calls_.starts; }
    bool record_end(const RunEntry& entry) override {
      ++calls_.ends;
      calls_.end_status = entry.exit_status;
      return true;
    }
    std::string name() const override { return "the fake ledger"; }

  private:
    const Script& s_;
    Calls& calls_;
  };

  Script s_;
  Calls& calls_;
  FakeLedger ledger_{s_, calls_};
};

// A job that ends as told, and keeps the spec it was given.
class FakeJobs final : public JobRunner {
public:
  explicit FakeJobs(JobEnd end) : end_(std::move(end)) {}
  void take_control(Pid /*self*/) override { ++took_control; }
  JobEnd run(const CommandSpec& spec, const Logger& /*log*/) override {
    ++runs;
    argv = spec.argv;
    env = spec.env;
    return end_;
  }
  [[noreturn]] void exec(const CommandSpec& /*spec*/) override {
    throw Fatal(exit_code::kOsError, "the fake cannot exec");
  }
  [[noreturn]] void exit_like(int /*status*/) override { throw Fatal(exit_code::kOsError, "the fake cannot exit"); }
  int runs = 0;
  int took_control = 0;
  std::vector<std::string> argv, env;

private:
  JobEnd end_;
};

struct Outcome {
  Exit exit;
  RunFacts facts;
  FakeLock::Calls calls;
  int job_runs = 0;
  int took_control = 0;  // the job runner was given the signals
  std::vector<std::string> job_env;
  std::string log;        // the JSON lines written
  std::string incidents;  // DIR's incident rows
};

Options options_for(const testutil::TempDir& dir) {
  Options o;
  o.dir = dir.path();
  o.command = {"tick.py"};
  o.identity.operation = "tick";
  o.identity.agent = "unit";
  return o;
}

Outcome run_with(const Options& o, const testutil::TempDir& dir, FakeLock::Script script, JobEnd job) {
  Outcome out;
  const std::string log_path = dir / "log.jsonl";
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(log_fd >= 0);
  {
    Logger log(Verbosity::Normal, LogFormat::Json, log_fd);
    const Context ctx{.env = {"PATH=/usr/bin:/bin"},
                      .pid = getpid(),
                      .start = looplock::MonotonicClock::now(),
                      .start_wall_ms = sys::realtime_ms(),
                      .on_held = {}};
    FakeJobs jobs(job);
    auto factory = [&](const StackSite&) {
      Stack stack;
      stack.locks.push_back(std::make_unique<FakeLock>(script, out.calls));
      return stack;
    };
    out.exit = Run(o, ctx, log, out.facts, factory, jobs).run();
    out.job_runs = jobs.runs;
    out.took_control = jobs.took_control;
    out.job_env = jobs.env;
  }
  ::close(log_fd);
  out.log = testutil::slurp(log_path).value_or("");
  out.incidents = testutil::slurp(dir / ".state.lock.incidents.jsonl").value_or("");
  return out;
}

JobEnd ended(int wait_status) {
  JobEnd j;
  j.status = wait_status;
  j.started = looplock::MonotonicClock::now();
  j.ended = j.started + std::chrono::milliseconds(1);
  return j;
}

FakeLock::Script answering(Acquisition a) {
  FakeLock::Script s;
  s.answers = {a};
  return s;
}

FakeLock::Script with_ledger(RunEntry e) {
  FakeLock::Script s;
  s.ledger_entry = std::move(e);
  return s;
}

// A ledger entry of operation "tick" from another host, started and ended
// `ago_ms` before now.
RunEntry tick_run(long long ago_ms) {
  RunEntry e;
  e.operation = "tick";
  e.host = "elsewhere";
  e.pid = 7;
  e.agent = "cron";
  e.started_ms = looplock::sys::realtime_ms() - ago_ms;
  e.ended_ms = e.started_ms + 1000;
  e.exit_status = 0;
  return e;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST_CASE(
    "Run, the lock acquired: the job runs under it, is given what the lock exports, and its status is looplock's") {
  testutil::TempDir dir;
  const Outcome r = run_with(options_for(dir), dir, {}, ended(3 << 8));
  CHECK(r.exit.kind == Exit::Kind::LikeWaitStatus);
  CHECK(r.exit.value == 3 << 8);
  CHECK(r.facts.outcome == RunOutcome::Failure);
  CHECK(r.calls.acquire == 1);
  CHECK(r.calls.exported == 1);
  CHECK(r.calls.released == 1);
  CHECK(r.job_runs == 1);
  CHECK(r.took_control == 1);  // once, through the runner: Run holds no signal state of its own
  CHECK(has(r.job_env, "FAKE_LOCK=held"));
  CHECK(r.incidents.empty());
}

TEST_CASE("Run, the lock busy under single_flight: the skip line names the holder, the job never runs") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.wait.policy = Policy::SingleFlight;
  o.wait.skip_exit_code = 3;
  const Outcome r = run_with(o, dir, answering(Acquisition::Busy), ended(0));
  CHECK(r.exit.kind == Exit::Kind::ExitStatus);
  CHECK(r.exit.value == 3);
  CHECK(r.facts.outcome == RunOutcome::Skipped);
  CHECK(r.job_runs == 0);
  CHECK(r.calls.released == 0);
  CHECK(r.log.find("\"event\":\"noop-locked\"") != std::string::npos);
  CHECK(r.log.find("the fake lock is held by pid 42 (a fake holder)") != std::string::npos);
  CHECK(r.log.find("\"fake\":{\"kind\":\"fake\"}") != std::string::npos);  // the kind's own fields
  CHECK(r.incidents.empty());
}

TEST_CASE("Run, the wait timed out: -E's status, an incident row with the kind's fields, the job never runs") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.wait.timeout = std::chrono::milliseconds(1);
  o.wait.conflict_exit_code = 9;
  const Outcome r = run_with(o, dir, answering(Acquisition::TimedOut), ended(0));
  CHECK(r.exit.kind == Exit::Kind::ExitStatus);
  CHECK(r.exit.value == 9);
  CHECK(r.facts.outcome == RunOutcome::Timeout);
  CHECK(r.job_runs == 0);
  CHECK(r.log.find("\"event\":\"lock_acquire_timeout\"") != std::string::npos);
  CHECK(r.incidents.find("\"error_code\":\"lock_acquire_timeout\"") != std::string::npos);
  CHECK(r.incidents.find("\"holder_pids\":[42]") != std::string::npos);
  CHECK(r.incidents.find("\"fake\":{\"kind\":\"fake\"}") != std::string::npos);
}

TEST_CASE("Run, the lease lost while the job ran: 76 whatever the job's status, and the run is not recorded as done") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.once_per.period = std::chrono::hours(1);
  JobEnd job = ended(0);
  job.lease_lost = true;
  job.ended_by = JobEnd::EndedBy::Lease;
  FakeLock::Script script = with_ledger(tick_run(2 * 3'600'000LL));  // a run of an earlier slot
  script.lease_lost_at_release = true;
  const Outcome r = run_with(o, dir, script, job);
  CHECK(r.exit.kind == Exit::Kind::ExitStatus);
  CHECK(r.exit.value == exit_code::kLeaseLost);
  CHECK(r.facts.outcome == RunOutcome::LeaseLost);
  CHECK(r.job_runs == 1);
  CHECK(r.calls.starts == 1);
  CHECK(r.calls.ends == 0);
}

TEST_CASE("Run, the ledger says this slot ran: the slot's skip before any wait, the lock never asked for") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.once_per.period = std::chrono::hours(1);
  const Outcome r = run_with(o, dir, with_ledger(tick_run(60'000)), ended(0));
  CHECK(r.exit.kind == Exit::Kind::ExitStatus);
  CHECK(r.exit.value == 0);
  CHECK(r.facts.outcome == RunOutcome::Skipped);
  CHECK(r.calls.acquire == 0);
  CHECK(r.job_runs == 0);
  CHECK(r.log.find("\"event\":\"noop-already-run\"") != std::string::npos);
  CHECK(r.log.find("the fake ledger") != std::string::npos);
}

TEST_CASE("Run, the slot's run found once the locks are held: the locks are let go, then the skip is said") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.once_per.period = std::chrono::hours(1);
  FakeLock::Script script = with_ledger(tick_run(60'000));
  script.ledger_locked_only = true;
  script.log_path = dir / "log.jsonl";
  const Outcome r = run_with(o, dir, script, ended(0));
  CHECK(r.exit.value == 0);
  CHECK(r.facts.outcome == RunOutcome::Skipped);
  CHECK(r.calls.acquire == 1);
  CHECK(r.calls.abandoned == 1);
  CHECK(r.calls.released == 0);
  CHECK(r.calls.starts == 0);
  CHECK(r.job_runs == 0);
  CHECK(r.log.find("\"event\":\"noop-already-run\"") != std::string::npos);
  CHECK_FALSE(r.calls.skip_said_before_let_go);
}

TEST_CASE("Run, the release finds the lock file replaced: a success becomes 74, a failure keeps its status") {
  testutil::TempDir dir;
  FakeLock::Script replaced;
  replaced.replaced_at_release = true;
  const Outcome ok = run_with(options_for(dir), dir, replaced, ended(0));
  CHECK(ok.exit.kind == Exit::Kind::ExitStatus);
  CHECK(ok.exit.value == exit_code::kVanished);
  CHECK(ok.facts.outcome == RunOutcome::Error);
  const Outcome failed = run_with(options_for(dir), dir, replaced, ended(5 << 8));
  CHECK(failed.exit.kind == Exit::Kind::LikeWaitStatus);
  CHECK(failed.exit.value == 5 << 8);
}

TEST_CASE("Run, the job ended by --max-time: 124, its row, and the end recorded with 124") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.limits.max_time = std::chrono::seconds(2);
  o.once_per.period = std::chrono::hours(1);
  JobEnd job = ended(SIGTERM);
  job.ended_by = JobEnd::EndedBy::MaxTime;
  const Outcome r = run_with(o, dir, with_ledger(tick_run(2 * 3'600'000LL)), job);
  CHECK(r.exit.kind == Exit::Kind::ExitStatus);
  CHECK(r.exit.value == exit_code::kMaxTime);
  CHECK(r.calls.starts == 1);
  CHECK(r.calls.ends == 1);
  CHECK(r.calls.end_status == exit_code::kMaxTime);
  CHECK(r.facts.outcome == RunOutcome::MaxTime);
  CHECK(r.calls.released == 1);
  CHECK(r.log.find("\"event\":\"max_time_exceeded\"") != std::string::npos);
  CHECK(r.incidents.find("\"error_code\":\"max_time_exceeded\"") != std::string::npos);
  CHECK(r.incidents.find("\"deadline_ms\":2000") != std::string::npos);
}

TEST_CASE("Run, a job that cannot start: the locks are let go (abandoned) and the error is looplock's") {
  testutil::TempDir dir;
  Options o = options_for(dir);
  o.lock.no_fork = true;  // the fake's exec throws, as exec_command does when exec(2) fails
  FakeLock::Calls calls;
  RunFacts facts;
  Logger log(Verbosity::Quiet, LogFormat::Json, -1);
  const Context ctx{.env = {},
                    .pid = getpid(),
                    .start = looplock::MonotonicClock::now(),
                    .start_wall_ms = sys::realtime_ms(),
                    .on_held = {}};
  FakeJobs jobs(ended(0));
  auto factory = [&](const StackSite&) {
    Stack s;
    s.locks.push_back(std::make_unique<FakeLock>(FakeLock::Script{}, calls));
    return s;
  };
  CHECK_THROWS_AS(Run(o, ctx, log, facts, factory, jobs).run(), Fatal);
  CHECK(calls.abandoned == 1);
  CHECK(calls.released == 0);
}
