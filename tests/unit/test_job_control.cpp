// The job loop over the system's job on POSIX (os/posix/job_control.hpp):
// real processes, signals, process groups; each run in a forked "looplock".
#include "os/posix/job_control.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/log.hpp"
#include "job/job_loop.hpp"
#include "os/clock.hpp"
#include "os/ids.hpp"
#include "os/posix/signals.hpp"
#include "os/unique_fd.hpp"
#include "testutil.hpp"

using looplock::CommandSpec;
using looplock::Fatal;
using looplock::Logger;
using looplock::Pid;
using looplock::UniqueFd;
using looplock::sys::InheritedSignals;
using testutil::TempDir;
using namespace std::chrono_literals;

namespace {

// looplock's own signal state for the run, as looplock takes it.
InheritedSignals take_control() {
  auto taken = looplock::sys::take_signal_control(getpid());
  REQUIRE(std::holds_alternative<InheritedSignals>(taken));
  return std::get<InheritedSignals>(std::move(taken));
}

std::vector<std::string> base_env() {
  const char* path = std::getenv("PATH");
  return {std::string("PATH=") + (path ? path : "/usr/bin:/bin")};
}

CommandSpec sh(const std::string& script, std::vector<std::string> env = base_env()) {
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = std::move(env);
  return spec;
}

// What one run_command in a child "looplock" process came to.
struct Result {
  int status = -1;       // the wait status run_command returned
  int fatal = -1;        // or the status of the Fatal it threw
  std::string message;   // and its message
  bool zombies = false;  // a child was left unreaped afterwards
  int ended_by = -1;     // JobEnd::EndedBy
  bool killed = false;
  bool lease_lost = false;
  long long ran_ms = -1;  // from the command's start to the end of its job
  std::string log;        // what the Logger wrote
};

// run_command runs in a forked child, as it would in looplock: it takes
// over SIGCHLD, reaps every child and may become a subreaper, which must not
// leak into the test process. `stdout_path` redirects the command's stdout.
class Looplock {
public:
  Looplock(const CommandSpec& spec, std::optional<InheritedSignals> inherited = std::nullopt,
           const std::string& stdout_path = {}) {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(p[0]);
      child(spec, inherited, stdout_path, p[1]);
    }
    close(p[1]);
    result_fd_ = p[0];
  }
  ~Looplock() {
    if (result_fd_ >= 0) close(result_fd_);
    if (pid_ > 0 && !reaped_) testutil::wait_child(pid_, std::chrono::seconds(1));
  }
  Pid pid() const { return pid_; }

  Result finish() {
    auto st = testutil::wait_child(pid_);
    reaped_ = true;
    REQUIRE(st);
    REQUIRE(WIFEXITED(*st));
    REQUIRE(WEXITSTATUS(*st) == 0);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(result_fd_, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    // "status fatal zombies ended_by killed lease_lost ran_ms\nmessage\n--log--\nlog"
    Result r;
    auto nl = out.find('\n');
    REQUIRE(nl != std::string::npos);
    int z = 0, killed = 0, lost = 0;
    REQUIRE(sscanf(out.c_str(), "%d %d %d %d %d %d %lld", &r.status, &r.fatal, &z, &r.ended_by, &killed, &lost,
                   &r.ran_ms) == 7);
    r.zombies = z != 0;
    r.killed = killed != 0;
    r.lease_lost = lost != 0;
    auto sep = out.find("\n--log--\n", nl);
    REQUIRE(sep != std::string::npos);
    r.message = out.substr(nl + 1, sep - nl - 1);
    r.log = out.substr(sep + 9);
    return r;
  }

private:
  [[noreturn]] static void child(const CommandSpec& spec, const std::optional<InheritedSignals>& inherited,
                                 const std::string& stdout_path, int result_fd) {
    int logfd = memfd_create("looplock-unit-log", MFD_CLOEXEC);
    if (logfd < 0) _exit(90);
    if (!stdout_path.empty()) {
      int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || dup2(out, 1) < 0) _exit(91);
      close(out);
    }
    Logger log(looplock::Verbosity::Normal, looplock::LogFormat::Text, logfd);
    InheritedSignals taken = take_control();
    int status = -1, fatal = -1, ended_by = -1;
    bool killed = false, lease_lost = false;
    long long ran_ms = -1;
    std::string message;
    try {
      looplock::sys::ProcessControl control(inherited ? *inherited : taken, getpid());
      looplock::JobEnd end = looplock::run_command(spec, control, log);
      status = end.status;
      ended_by = static_cast<int>(end.ended_by);
      killed = end.killed;
      lease_lost = end.lease_lost;
      ran_ms = looplock::ms_of(end.ended - end.started);
    } catch (const Fatal& f) {
      fatal = f.status();
      message = f.what();
    }
    bool zombies = waitpid(-1, nullptr, WNOHANG) > 0;
    std::string logged;
    char buf[4096];
    for (ssize_t n; (n = pread(logfd, buf, sizeof buf, static_cast<off_t>(logged.size()))) > 0;)
      logged.append(buf, static_cast<size_t>(n));
    std::string out = std::to_string(status) + " " + std::to_string(fatal) + " " + std::to_string(zombies) + " " +
                      std::to_string(ended_by) + " " + std::to_string(killed) + " " + std::to_string(lease_lost) + " " +
                      std::to_string(ran_ms) + "\n" + message + "\n--log--\n" + logged;
    (void)!write(result_fd, out.data(), out.size());
    _exit(0);
  }

  Pid pid_ = -1;
  int result_fd_ = -1;
  bool reaped_ = false;
};

Result run(const CommandSpec& spec, std::optional<InheritedSignals> inherited = std::nullopt,
           const std::string& stdout_path = {}) {
  Looplock l(spec, inherited, stdout_path);
  return l.finish();
}

// SigBlk/SigIgn/... of /proc/PID/status as a bit set.
unsigned long long status_mask(const std::string& status, const std::string& field) {
  auto at = status.find(field + ":");
  REQUIRE(at != std::string::npos);
  return std::stoull(status.substr(at + field.size() + 1), nullptr, 16);
}
bool has_sig(unsigned long long mask, int sig) { return (mask >> (sig - 1)) & 1; }

}  // namespace

TEST_CASE("run_command returns the command's wait status") {
  Result r = run(sh("exit 7"));
  CHECK(r.fatal == -1);
  CHECK(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 7);
  CHECK(looplock::shell_status(r.status) == 7);
  CHECK_FALSE(r.zombies);

  r = run(sh("exit 0"));
  CHECK(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 0);

  r = run(sh("kill -TERM $$"));
  CHECK(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGTERM);

  // Found on PATH, with arguments passed untouched.
  CommandSpec spec;
  spec.argv = {"sh", "-c", "test \"$1\" = '--help -w x' && test $# = 1", "argv0", "--help -w x"};
  spec.env = base_env();
  r = run(spec);
  CHECK(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 0);
}

TEST_CASE("run_command passes exactly the given environment") {
  std::vector<std::string> env = base_env();
  env.push_back("LOOPLOCK_TEST=bar baz");
  CHECK(run(sh("test \"$LOOPLOCK_TEST\" = 'bar baz'", env)).status == W_EXITCODE(0, 0));
  CHECK(run(sh("test -z \"${LOOPLOCK_TEST+set}\"")).status == W_EXITCODE(0, 0));
  CHECK(run(sh("test -z \"${HOME+set}\"")).status == W_EXITCODE(0, 0));  // nothing else leaks in
}

TEST_CASE("run_command leaves only pass_fd open in the command") {
  TempDir dir;
  UniqueFd fd(::open((dir / "f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(fd);
  const std::string n = std::to_string(fd.get());
  CommandSpec spec = sh("test -e /proc/$$/fd/" + n);
  CHECK(run(spec).status == W_EXITCODE(1, 0));  // close-on-exec: not inherited
  spec.pass_fd = fd.get();
  CHECK(run(spec).status == W_EXITCODE(0, 0));
}

TEST_CASE("the command starts with the inherited signal mask and dispositions") {
  TempDir dir;
  const std::string out = dir / "status";
  // cat reads its own status (a shell would reset its mask and SIGCHLD).
  CommandSpec spec;
  spec.argv = {"/bin/cat", "/proc/self/status"};
  spec.env = base_env();

  auto with = [](void (*chld)(int), void (*pipe)(int)) {
    InheritedSignals in{};
    sigemptyset(&in.mask);
    struct sigaction a {};
    sigemptyset(&a.sa_mask);
    a.sa_handler = chld;
    in.actions.emplace_back(SIGCHLD, a);
    a.sa_handler = pipe;
    in.actions.emplace_back(SIGPIPE, a);
    return in;
  };
  InheritedSignals plain = with(SIG_DFL, SIG_DFL);
  REQUIRE(run(spec, plain, out).status == W_EXITCODE(0, 0));
  auto status = testutil::slurp(out);
  REQUIRE(status);
  unsigned long long blk = status_mask(*status, "SigBlk");
  unsigned long long ign = status_mask(*status, "SigIgn");
  // looplock blocks the forwarded signals and ignores SIGPIPE for itself:
  // none of that reaches the command.
  CHECK_FALSE(has_sig(blk, SIGTERM));
  CHECK_FALSE(has_sig(blk, SIGCHLD));
  CHECK_FALSE(has_sig(blk, SIGUSR1));
  CHECK_FALSE(has_sig(blk, SIGRTMIN));
  CHECK_FALSE(has_sig(ign, SIGCHLD));
  CHECK_FALSE(has_sig(ign, SIGPIPE));

  InheritedSignals odd = with(SIG_IGN, SIG_IGN);
  sigaddset(&odd.mask, SIGUSR2);
  REQUIRE(run(spec, odd, out).status == W_EXITCODE(0, 0));
  status = testutil::slurp(out);
  REQUIRE(status);
  blk = status_mask(*status, "SigBlk");
  ign = status_mask(*status, "SigIgn");
  CHECK(has_sig(blk, SIGUSR2));
  CHECK_FALSE(has_sig(blk, SIGTERM));
  CHECK(has_sig(ign, SIGCHLD));
  CHECK(has_sig(ign, SIGPIPE));
}

TEST_CASE("exec failures: 127 not found, 126 not executable") {
  TempDir dir;
  auto fatal_of = [&](std::vector<std::string> argv) {
    CommandSpec spec;
    spec.argv = std::move(argv);
    spec.env = base_env();
    return run(spec);
  };
  Result r = fatal_of({"/nonexistent/looplock-cmd"});
  CHECK(r.fatal == 127);
  CHECK(r.message.find("/nonexistent/looplock-cmd") != std::string::npos);
  CHECK(r.message.find("No such file") != std::string::npos);
  CHECK_FALSE(r.zombies);  // the failed child was reaped
  CHECK(fatal_of({"looplock-no-such-command-on-path"}).fatal == 127);
  testutil::write_file(dir / "not-executable", "#!/bin/sh\nexit 0\n", 0644);
  CHECK(fatal_of({dir / "not-executable"}).fatal == 126);
  CHECK(fatal_of({dir.path()}).fatal == 126);  // a directory
}

namespace {
// A command that prints "ready" on `ready_fd` (then closes it), and then
// waits; it gives up with 3 after ~10 s. `trap` sets what the signals do.
CommandSpec ready_then_wait(int ready_fd, const std::string& trap) {
  const std::string n = std::to_string(ready_fd);
  CommandSpec spec = sh(trap + "; echo ready >&" + n + "; exec " + n +
                        ">&-; i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 3");
  spec.pass_fd = ready_fd;
  return spec;
}
}  // namespace

namespace {
// Sets `sig`'s disposition to the default while it lives, then puts back
// what it was.
struct DefaultDisposition {
  int sig;
  struct sigaction kept {};
  explicit DefaultDisposition(int s) : sig(s) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    REQUIRE(sigaction(sig, &dfl, &kept) == 0);
  }
  ~DefaultDisposition() { sigaction(sig, &kept, nullptr); }
  DefaultDisposition(const DefaultDisposition&) = delete;
  DefaultDisposition& operator=(const DefaultDisposition&) = delete;
};

// The pipe a test job writes "ready" into once it is set up: its write end
// goes to the job as CommandSpec::pass_fd; wait() drops the test's own copy
// and reads until "ready".
struct ReadyPipe {
  UniqueFd r, w;
  ReadyPipe() {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    r.reset(p[0]);
    w.reset(p[1]);
  }
  void wait() {
    w.reset();
    REQUIRE(testutil::read_until(r.get(), "ready"));
  }
};
}  // namespace

TEST_CASE("a signal sent to looplock reaches the command") {
  for (int sig : {SIGUSR1, SIGTERM, SIGHUP, SIGALRM, SIGRTMIN + 1}) {
    CAPTURE(sig);
    // Its default disposition, for looplock to inherit: one ignored when the
    // tests started (HUP under nohup(1)) stays ignored, as nohup relies on.
    DefaultDisposition dfl(sig);
    ReadyPipe ready;
    Looplock l(ready_then_wait(ready.w.get(), "trap 'exit 42' " + std::to_string(sig)));
    ready.wait();
    REQUIRE(kill(l.pid(), sig) == 0);
    Result r = l.finish();
    CHECK(r.fatal == -1);
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 42);
  }
}

TEST_CASE("--kill-after: KILL follows a TERM the command ignores") {
  ReadyPipe ready;
  CommandSpec spec = ready_then_wait(ready.w.get(), "trap '' TERM");
  spec.limits.kill_after = 200ms;
  Looplock l(spec);
  ready.wait();
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(kill(l.pid(), SIGTERM) == 0);
  Result r = l.finish();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGKILL);
  CHECK(took >= 0.15);
  CHECK(took < 8.0);
  CHECK(r.log.find("KILL") != std::string::npos);
}

namespace {
bool process_exists(Pid pid) { return kill(pid, 0) == 0 || errno == EPERM; }

std::optional<Pid> read_pid(const std::string& path) {
  for (int i = 0; i < 2000; ++i) {  // up to 10 s
    if (auto text = testutil::slurp(path); text && !text->empty() && text->back() == '\n') {
      return static_cast<Pid>(std::stol(*text));
    }
    usleep(5000);
  }
  return std::nullopt;
}

// A job of two processes: the command (sh, which `trap`s as given) and a
// child of it that ignores TERM and writes its pid to `pid_file`, then says
// ready on `ready_fd`.
CommandSpec job_with_stubborn_child(int ready_fd, const std::string& pid_file, const std::string& trap = "") {
  const std::string n = std::to_string(ready_fd);
  CommandSpec spec = sh(trap + (trap.empty() ? "" : "; ") + "sh -c \"trap '' TERM; echo \\$\\$ > " + pid_file +
                        "; echo ready >&" + n + "; exec " + n + ">&-; exec sleep 30\" & wait; wait");
  spec.pass_fd = ready_fd;
  return spec;
}
}  // namespace

TEST_CASE("a signal sent to looplock reaches every process of the job once") {
  TempDir dir;
  const std::string seen = dir / "seen";
  ReadyPipe ready;
  const std::string n = std::to_string(ready.w.get());
  CommandSpec spec =
      sh("trap 'echo leader >> " + seen + "' USR1; sh -c \"trap 'echo child >> " + seen +
         "; exit 0' USR1; echo ready >&" + n + "; exec " + n + ">&-; while :; do sleep 0.05; done\" & wait; wait");
  spec.pass_fd = ready.w.get();
  Looplock l(spec);
  ready.wait();
  REQUIRE(kill(l.pid(), SIGUSR1) == 0);
  Result r = l.finish();
  CHECK(r.fatal == -1);
  CHECK(r.status == W_EXITCODE(0, 0));
  auto text = testutil::slurp(seen);
  REQUIRE(text);
  std::vector<std::string> lines;
  for (size_t i = 0, nl; (nl = text->find('\n', i)) != std::string::npos; i = nl + 1)
    lines.push_back(text->substr(i, nl - i));
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"child", "leader"});
}

TEST_CASE("--kill-after: KILL reaches a process of the job that outlives the command") {
  TempDir dir;
  const std::string pid_file = dir / "pid";
  ReadyPipe ready;
  CommandSpec spec = job_with_stubborn_child(ready.w.get(), pid_file);
  spec.limits.kill_after = 300ms;
  Looplock l(spec);
  ready.wait();
  auto stubborn = read_pid(pid_file);
  REQUIRE(stubborn);
  REQUIRE(kill(l.pid(), SIGTERM) == 0);
  Result r = l.finish();
  // The command (sh) died of TERM at once; its child ignored it and was
  // killed --kill-after later, before looplock ended.
  CHECK(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGTERM);
  CHECK(r.killed);
  CHECK(r.ran_ms >= 250);
  CHECK_FALSE(process_exists(*stubborn));
  CHECK(r.log.find("KILL") != std::string::npos);
}

TEST_CASE("without --kill-after a forwarded TERM waits for the command only") {
  TempDir dir;
  const std::string pid_file = dir / "pid";
  ReadyPipe ready;
  Looplock l(job_with_stubborn_child(ready.w.get(), pid_file));
  ready.wait();
  auto stubborn = read_pid(pid_file);
  REQUIRE(stubborn);
  REQUIRE(kill(l.pid(), SIGTERM) == 0);
  Result r = l.finish();
  CHECK(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGTERM);
  CHECK_FALSE(r.killed);
  CHECK(process_exists(*stubborn));  // as timeout(1) without -k leaves it
  kill(*stubborn, SIGKILL);
}

TEST_CASE("--max-time ends the whole job: TERM, then KILL after kill-after") {
  TempDir dir;
  const std::string pid_file = dir / "pid";
  for (bool obeys : {true, false}) {
    CAPTURE(obeys);
    ReadyPipe ready;
    unlink(pid_file.c_str());
    CommandSpec spec = job_with_stubborn_child(ready.w.get(), pid_file, obeys ? "" : "trap '' TERM");
    if (obeys) {  // a plain job: everything dies of TERM
      const std::string n = std::to_string(ready.w.get());
      spec = sh("echo $$ > " + pid_file + "; echo ready >&" + n + "; exec " + n + ">&-; sleep 30 & wait");
      spec.pass_fd = ready.w.get();
    }
    spec.limits.max_time = 300ms;
    spec.limits.max_time_kill_after = 300ms;
    Looplock l(spec);
    ready.wait();
    auto pid = read_pid(pid_file);
    REQUIRE(pid);
    Result r = l.finish();
    CHECK(r.ended_by == static_cast<int>(looplock::JobEnd::EndedBy::MaxTime));
    CHECK(r.killed == !obeys);
    CHECK(r.ran_ms >= (obeys ? 250 : 550));
    CHECK(r.ran_ms < 8000);
    CHECK_FALSE(process_exists(*pid));
  }
}

namespace {
// A lease whose deadlines are fixed from the start unless renew() moves
// them; it counts renewals in a file (the run happens in a forked child).
class FakeLease final : public looplock::Lease {
public:
  FakeLease(long long term_in_ns, long long kill_in_ns, bool extends, bool gone, std::string counter)
      : start_(now()),
        term_(start_ + term_in_ns),
        kill_(start_ + kill_in_ns),
        extends_(extends),
        gone_(gone),
        counter_(std::move(counter)) {}
  looplock::Instant next_renewal() const override { return looplock::instant_ns(next_); }
  bool renew(looplock::Deadline return_by, const looplock::sys::Interrupts&) override {
    CHECK(return_by);
    CHECK(looplock::ns_of(*return_by) <= term_);
    testutil::write_file(counter_, std::to_string(++renewals_) + "\n", 0644);
    next_ = now() + 50'000'000;
    if (gone_) return false;
    if (extends_) {
      term_ = now() + 300'000'000;
      kill_ = term_ + 300'000'000;
    }
    return true;
  }
  looplock::Instant term_by() const override { return looplock::instant_ns(term_); }
  looplock::Instant kill_by() const override { return looplock::instant_ns(kill_); }

private:
  static long long now() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  }
  long long start_, term_, kill_;
  long long next_ = now() + 50'000'000;
  bool extends_, gone_;
  std::string counter_;
  int renewals_ = 0;
};
}  // namespace

TEST_CASE("a lease that is not renewed ends the job before it expires") {
  TempDir dir;
  FakeLease lease(300'000'000, 700'000'000, /*extends=*/false, /*gone=*/false, dir / "renewals");
  CommandSpec spec = sh("trap '' TERM; sleep 5; exit 3");
  spec.lease = &lease;
  Result r = run(spec);
  CHECK(r.lease_lost);
  CHECK(r.ended_by == static_cast<int>(looplock::JobEnd::EndedBy::Lease));
  CHECK(r.killed);
  CHECK(r.ran_ms >= 650);
  CHECK(r.ran_ms < 4000);
  CHECK(WIFSIGNALED(r.status));
}

TEST_CASE("a renewed lease keeps the job running") {
  TempDir dir;
  const std::string counter = dir / "renewals";
  FakeLease lease(300'000'000, 600'000'000, /*extends=*/true, /*gone=*/false, counter);
  CommandSpec spec = sh("sleep 1; exit 4");
  spec.lease = &lease;
  Result r = run(spec);
  CHECK_FALSE(r.lease_lost);
  CHECK(r.status == W_EXITCODE(4, 0));
  auto count = testutil::slurp(counter);
  REQUIRE(count);
  CHECK(std::stoi(*count) >= 5);
}

TEST_CASE("a lease known gone ends the job at once") {
  TempDir dir;
  FakeLease lease(5'000'000'000LL, 10'000'000'000LL, /*extends=*/false, /*gone=*/true, dir / "renewals");
  CommandSpec spec = sh("sleep 5; exit 3");
  spec.lease = &lease;
  Result r = run(spec);
  CHECK(r.lease_lost);
  CHECK(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGTERM);
  CHECK(r.ran_ms < 3000);
}

TEST_CASE("a lock descriptor that cannot be passed: 71, and the command does not run") {
  TempDir dir;
  const std::string marker = dir / "ran";
  CommandSpec spec = sh("touch " + marker);
  spec.pass_fd = 987;  // not open: F_SETFD fails
  Result r = run(spec);
  CHECK(r.fatal == 71);
  CHECK(r.message.find("lock descriptor") != std::string::npos);
  CHECK_FALSE(r.zombies);
  CHECK_FALSE(testutil::slurp(marker));

  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    looplock::sys::ProcessControl in(take_control(), getpid());
    try {
      looplock::exec_command(spec, in);
    } catch (const Fatal& f) {
      _exit(f.status());
    }
    _exit(101);
  }
  auto st = testutil::wait_child(child);
  REQUIRE(st);
  CHECK(WEXITSTATUS(*st) == 71);
  CHECK_FALSE(testutil::slurp(marker));
}

TEST_CASE("exec_command replaces the process; a failure throws") {
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    looplock::sys::ProcessControl in(take_control(), getpid());
    try {
      looplock::exec_command(sh("exit 9"), in);
    } catch (const Fatal& f) {
      _exit(100);
    }
    _exit(101);
  }
  auto st = testutil::wait_child(child);
  REQUIRE(st);
  CHECK(WIFEXITED(*st));
  CHECK(WEXITSTATUS(*st) == 9);

  child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    looplock::sys::ProcessControl in(take_control(), getpid());
    CommandSpec spec;
    spec.argv = {"/nonexistent/looplock-cmd"};
    try {
      looplock::exec_command(spec, in);
    } catch (const Fatal& f) {
      _exit(f.status());
    }
    _exit(101);
  }
  st = testutil::wait_child(child);
  REQUIRE(st);
  CHECK(WEXITSTATUS(*st) == 127);
}
