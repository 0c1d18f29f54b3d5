// The job loop over a fake system job (os/job_control.hpp): what looplock
// does when, without processes, on every system. tests/unit/
// test_job_control.cpp runs the same loop over real processes.
#include "job/job_loop.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "job/job.hpp"
#include "os/clock.hpp"
#include "os/job_control.hpp"
#include "os/sys.hpp"

using looplock::CommandSpec;
using looplock::Fatal;
using looplock::JobEnd;
using looplock::Logger;
using looplock::Pid;
namespace sys = looplock::sys;
using namespace std::chrono_literals;

namespace {

constexpr int kTerm = 15;  // the numbers of the fake's signals: any will do
constexpr int kInt = 2;
constexpr int kHup = 1;

// What the fake job does, and what looplock did to it.
struct Script {
  std::optional<int> ends_with;          // the command ends at once with this status
  std::optional<int> ends_on_terminate;  // ... or when asked to end
  std::vector<sys::Forwarded> signals;   // signals to looplock, passed on one per wait
  int lost_err = 0;                      // reap() loses track of the job
  bool rest_of_group_lingers = false;    // the command ended, its group is not gone until a KILL
  std::vector<Pid> catch_warning;        // the processes that handle --warn-before's signal
  std::optional<sys::Failure> start_fails;
};

struct Seen {
  int terminated = 0;
  int killed = 0;
  int waits = 0;
  int waits_without_limit = 0;
  int warning_signal = 0;
  int warning_passes = 0;
};

class FakeWarning final : public sys::JobWarning {
public:
  FakeWarning(std::vector<Pid> catchers, Seen& seen) : catchers_(std::move(catchers)), seen_(seen) {}
  bool pass() override {
    ++seen_.warning_passes;
    sent_ = catchers_;
    return true;
  }
  const std::vector<Pid>& sent() const override { return sent_; }
  std::vector<Pid> skipped() const override { return {}; }

private:
  std::vector<Pid> catchers_;
  std::vector<Pid> sent_;
  Seen& seen_;
};

class FakeJob final : public sys::RunningJob {
public:
  FakeJob(Script& s, Seen& seen) : s_(s), seen_(seen), status_(s.ends_with) {}
  Pid group() const override { return 4242; }
  int terminal_error() const override { return 0; }
  Reaped reap() override {
    if (s_.lost_err != 0) return {std::nullopt, s_.lost_err};
    if (!status_ || reported_) return {};
    reported_ = true;
    return {status_, 0};
  }
  bool gone() const override { return reported_ && (!s_.rest_of_group_lingers || seen_.killed > 0); }
  void terminate() override {
    ++seen_.terminated;
    if (!status_) status_ = s_.ends_on_terminate;
  }
  void kill() override {
    ++seen_.killed;
    if (!status_) status_ = 9;
  }
  std::optional<sys::Forwarded> pass_signal(looplock::Deadline until) override {
    ++seen_.waits;
    if (next_signal_ < s_.signals.size()) return s_.signals[next_signal_++];
    if (!until) {
      // Nothing would ever come: the test's script is at its end.
      ++seen_.waits_without_limit;
      if (!status_) status_ = 0;
      return std::nullopt;
    }
    std::this_thread::sleep_until(std::chrono::steady_clock::now() + (*until - looplock::MonotonicClock::now()));
    return std::nullopt;
  }
  const sys::Interrupts& interrupting() const override { throw std::logic_error("no lease in these tests"); }
  std::unique_ptr<sys::JobWarning> warning(int sig) override {
    seen_.warning_signal = sig;
    return std::make_unique<FakeWarning>(s_.catch_warning, seen_);
  }

private:
  Script& s_;
  Seen& seen_;
  std::optional<int> status_;
  bool reported_ = false;
  size_t next_signal_ = 0;
};

class FakeControl final : public sys::JobControl {
public:
  FakeControl(Script& s, Seen& seen) : s_(s), seen_(seen) {}
  std::variant<std::unique_ptr<sys::RunningJob>, sys::Failure> start(const sys::JobStart&) override {
    if (s_.start_fails) return *s_.start_fails;
    return std::make_unique<FakeJob>(s_, seen_);
  }
  sys::Failure exec(const sys::JobStart&) override { return {.err = ENOENT, .of = sys::Failure::Of::Command}; }

private:
  Script& s_;
  Seen& seen_;
};

CommandSpec command() {
  CommandSpec spec;
  spec.argv = {"tick.py"};
  return spec;
}

struct Ran {
  JobEnd end;
  Seen seen;
};

Ran run(Script s, const CommandSpec& spec = command()) {
  Ran r;
  FakeControl control(s, r.seen);
  const Logger log(looplock::Verbosity::Quiet, looplock::LogFormat::Json, -1);
  r.end = looplock::run_command(spec, control, log);
  return r;
}

}  // namespace

TEST_CASE("a command that ends by itself: its status, and nothing sent to it") {
  Script s;
  s.ends_with = 7;
  const Ran r = run(s);
  CHECK(r.end.status == 7);
  CHECK(r.end.ended_by == JobEnd::EndedBy::Command);
  CHECK_FALSE(r.end.signalled);
  CHECK_FALSE(r.end.killed);
  CHECK(r.end.pgid == 4242);
  CHECK(r.seen.terminated == 0);
  CHECK(r.seen.killed == 0);
  CHECK(r.end.ended >= r.end.started);
}

TEST_CASE("a signal passed on is noted; without --kill-after nothing follows it") {
  Script s;
  s.signals = {{kHup, false}};
  const Ran r = run(s);
  CHECK(r.end.signalled);
  CHECK(r.seen.killed == 0);
  CHECK(r.seen.waits_without_limit == 1);  // no deadline: the loop waits without limit
}

TEST_CASE("--kill-after: a TERM or INT passed on is followed by KILL, and the whole group is waited for") {
  for (const int sig : {kTerm, kInt}) {
    Script s;
    s.signals = {{sig, true}};
    s.rest_of_group_lingers = true;
    CommandSpec spec = command();
    spec.limits.kill_after = 20ms;
    const Ran r = run(s, spec);
    CHECK(r.seen.killed == 1);
    CHECK(r.end.killed);
    CHECK(r.end.ended_by == JobEnd::EndedBy::Command);  // ended by whoever sent the signal
    CHECK(r.end.status == 9);
    CHECK(r.end.ended - r.end.started >= 20ms);
  }
}

TEST_CASE("--kill-after: a signal that does not ask for the end starts no KILL") {
  Script s;
  s.signals = {{kHup, false}};
  CommandSpec spec = command();
  spec.limits.kill_after = 20ms;
  const Ran r = run(s, spec);
  CHECK(r.seen.killed == 0);
}

TEST_CASE("--max-time: the job is asked to end once, and the run says so") {
  Script s;
  s.ends_on_terminate = 143;
  CommandSpec spec = command();
  spec.limits.max_time = 30ms;
  const Ran r = run(s, spec);
  CHECK(r.seen.terminated == 1);
  CHECK(r.seen.killed == 0);
  CHECK(r.end.ended_by == JobEnd::EndedBy::MaxTime);
  CHECK(r.end.status == 143);
  CHECK(r.end.signalled);
  REQUIRE(r.end.term_sent);
  CHECK(*r.end.term_sent - r.end.started >= 30ms);
  CHECK(r.seen.waits_without_limit == 0);
}

TEST_CASE("--max-time with its kill-after: a job that ignores the TERM is killed") {
  Script s;  // ends only when killed
  CommandSpec spec = command();
  spec.limits.max_time = 10ms;
  spec.limits.max_time_kill_after = 20ms;
  const Ran r = run(s, spec);
  CHECK(r.seen.terminated == 1);
  CHECK(r.seen.killed == 1);
  CHECK(r.end.killed);
  CHECK(r.end.ended_by == JobEnd::EndedBy::MaxTime);
  CHECK(r.end.status == 9);
}

TEST_CASE("--warn-before: the warning goes out before --max-time's TERM, and who got it is kept") {
  Script s;
  s.ends_on_terminate = 143;
  s.catch_warning = {101, 102};
  CommandSpec spec = command();
  spec.limits.max_time = 60ms;
  spec.limits.warn_before = 40ms;
  spec.limits.warn_signal = 10;
  const Ran r = run(s, spec);
  CHECK(r.seen.warning_signal == 10);
  CHECK(r.seen.warning_passes >= 1);
  CHECK(r.end.warn_signal == 10);
  CHECK(r.end.warned_pids == std::vector<Pid>{101, 102});
  REQUIRE(r.end.warned);
  REQUIRE(r.end.term_sent);
  CHECK(*r.end.warned < *r.end.term_sent);
  CHECK(r.end.ended_by == JobEnd::EndedBy::MaxTime);
}

namespace {
// The Fatal a run of `s` ends with: its status and message.
std::pair<int, std::string> fatal_of(const Script& s) {
  try {
    (void)run(s);
  } catch (const Fatal& f) {
    return {f.status(), f.what()};
  }
  FAIL("no Fatal");
  return {};
}
}  // namespace

TEST_CASE("looplock that loses track of the job stops with 71") {
  Script s;
  s.lost_err = ECHILD;
  const auto [status, message] = fatal_of(s);
  CHECK(status == 71);
  CHECK(message.find("lost track of the command") != std::string::npos);
}

TEST_CASE("a command that cannot be started: 71 with the system's words, 126 or 127 when it cannot be executed") {
  Script s;
  s.start_fails = sys::Failure{.what = "cannot start the command (vfork)", .err = EAGAIN};
  const auto [status, message] = fatal_of(s);
  CHECK(status == 71);
  CHECK(message.find("cannot start the command (vfork)") != std::string::npos);
  for (const auto& [err, exec_status] : {std::pair{ENOENT, 127}, std::pair{EACCES, 126}}) {
    s.start_fails = sys::Failure{.err = err, .of = sys::Failure::Of::Command};
    const auto [got, said] = fatal_of(s);
    CHECK(got == exec_status);
    CHECK(said.find("cannot run") != std::string::npos);
  }
}

TEST_CASE("exec_failure_status: 127 when the command was not found, else 126") {
  CHECK(looplock::exec_failure_status(ENOENT) == 127);
  CHECK(looplock::exec_failure_status(ENOTDIR) == 127);
  CHECK(looplock::exec_failure_status(ENAMETOOLONG) == 127);
  CHECK(looplock::exec_failure_status(EACCES) == 126);
  CHECK(looplock::exec_failure_status(EPERM) == 126);
}
