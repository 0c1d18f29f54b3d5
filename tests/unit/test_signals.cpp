// looplock's own signal state (signals.hpp): what it inherits and gives
// back to the command, the signals it supervises, and leaving the way the
// command left (its status, or dying of its signal without a core file).
#include "os/posix/signals.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "job/job.hpp"
#include "os/ids.hpp"
#include "os/job_control.hpp"
#include "os/signal_names.hpp"
#include "testutil.hpp"

using looplock::Pid;
using looplock::sys::InheritedSignals;

TEST_CASE("shell_status") {
  CHECK(looplock::shell_status(W_EXITCODE(0, 0)) == 0);
  CHECK(looplock::shell_status(W_EXITCODE(7, 0)) == 7);
  CHECK(looplock::shell_status(W_EXITCODE(255, 0)) == 255);
  CHECK(looplock::shell_status(W_EXITCODE(0, SIGTERM)) == 128 + SIGTERM);
  CHECK(looplock::shell_status(W_EXITCODE(0, SIGKILL)) == 137);
  CHECK(looplock::shell_status(W_EXITCODE(0, SIGSEGV) | 0x80) == 128 + SIGSEGV);  // with a core dump
  CHECK(looplock::shell_status(W_STOPCODE(SIGSTOP)) == 71);                       // not an ending

  // Real wait statuses.
  Pid child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(42);
  auto st = testutil::wait_child(child);
  REQUIRE(st);
  CHECK(looplock::shell_status(*st) == 42);
  child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
    _exit(0);
  }
  st = testutil::wait_child(child);
  REQUIRE(st);
  CHECK(looplock::shell_status(*st) == 143);
}

TEST_CASE("supervised_signals: every signal but KILL and STOP") {
  sigset_t set = looplock::sys::supervised_signals();
  for (int s : {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM,   SIGPIPE,  SIGVTALRM, SIGPROF,
                SIGXCPU, SIGXFSZ, SIGCHLD, SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT,   SIGSEGV,  SIGBUS,    SIGFPE,
                SIGILL,  SIGABRT, SIGTRAP, SIGSYS,  SIGIO,   SIGPWR,  SIGSTKFLT, SIGWINCH, SIGURG}) {
    CAPTURE(s);
    CHECK(sigismember(&set, s) == 1);
  }
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) {
    CAPTURE(s);
    CHECK(sigismember(&set, s) == 1);
  }
  CHECK(sigismember(&set, SIGKILL) == 0);
  CHECK(sigismember(&set, SIGSTOP) == 0);
}

TEST_CASE("take_signal_control captures the inherited state and sets looplock's own") {
  testutil::SignalStateGuard guard;
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGCHLD, &ign, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGUSR2);
  sigprocmask(SIG_BLOCK, &blocked, nullptr);

  struct rlimit core_before {};
  REQUIRE(getrlimit(RLIMIT_CORE, &core_before) == 0);

  auto taken = looplock::sys::take_signal_control(getpid());
  REQUIRE(std::holds_alternative<InheritedSignals>(taken));
  InheritedSignals in = std::get<InheritedSignals>(std::move(taken));
  auto inherited = [&](int sig) {
    for (const auto& [s, act] : in.actions)
      if (s == sig) return act.sa_handler;
    FAIL("signal " << sig << " not recorded");
    return SIG_ERR;
  };
  CHECK((inherited(SIGCHLD) == SIG_IGN));
  CHECK((inherited(SIGPIPE) == SIG_DFL));
  CHECK(in.core_known);
  CHECK(in.core.rlim_cur == core_before.rlim_cur);
  struct rlimit core_now {};
  REQUIRE(getrlimit(RLIMIT_CORE, &core_now) == 0);
  CHECK(core_now.rlim_cur == 0);  // no core file of looplock's own
  CHECK(core_now.rlim_max == core_before.rlim_max);
  setrlimit(RLIMIT_CORE, &core_before);
  CHECK(sigismember(&in.mask, SIGTERM));
  CHECK(sigismember(&in.mask, SIGUSR2));

  struct sigaction now {};
  sigaction(SIGCHLD, nullptr, &now);
  CHECK((now.sa_handler == SIG_DFL));  // so that the command can be waited for
  sigaction(SIGPIPE, nullptr, &now);
  CHECK((now.sa_handler == SIG_IGN));  // a closed stderr must not kill looplock
  sigset_t mask;
  sigprocmask(SIG_BLOCK, nullptr, &mask);
  CHECK_FALSE(sigismember(&mask, SIGTERM));  // INT, TERM, HUP, QUIT end a wait
  CHECK(sigismember(&mask, SIGUSR2));        // others stay as they were
}

TEST_CASE("exit_like exits with the status or dies of the signal, without a core") {
  auto outcome = [](int wait_status) {
    Pid child = fork();
    REQUIRE(child >= 0);
    if (child == 0) looplock::sys::exit_like(wait_status, looplock::shell_status(wait_status));
    auto st = testutil::wait_child(child);
    REQUIRE(st);
    return *st;
  };
  int st = outcome(W_EXITCODE(5, 0));
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 5);
  st = outcome(W_EXITCODE(0, SIGTERM));
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGTERM);
  st = outcome(W_EXITCODE(0, SIGSEGV) | 0x80);  // doctest handles SIGSEGV: exit_like must reset it
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGSEGV);
  CHECK_FALSE(WCOREDUMP(st));
  // A signal the caller ignored or blocked is still the one looplock dies of.
  {
    testutil::SignalStateGuard guard;
    signal(SIGUSR1, SIG_IGN);
    sigset_t b;
    sigemptyset(&b);
    sigaddset(&b, SIGUSR1);
    sigprocmask(SIG_BLOCK, &b, nullptr);
    st = outcome(W_EXITCODE(0, SIGUSR1));
    signal(SIGUSR1, SIG_DFL);
  }
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGUSR1);
}

TEST_CASE("parse_signal and signal_name: names with or without SIG, any case, numbers, RTMIN+N") {
  CHECK(looplock::parse_signal("USR1") == SIGUSR1);
  CHECK(looplock::parse_signal("SIGUSR2") == SIGUSR2);
  CHECK(looplock::parse_signal("usr1") == SIGUSR1);
  CHECK(looplock::parse_signal("sigterm") == SIGTERM);
  CHECK(looplock::parse_signal("10") == 10);
  CHECK(looplock::parse_signal("RTMIN+2") == SIGRTMIN + 2);
  for (const char* bad : {"", "SIG", "USR3", "0", "999", "RTMIN+", "RTMIN+999", "RTMIN+x", "-1", "1 ", "TERM\n"}) {
    CHECK_MESSAGE(!looplock::parse_signal(bad), bad);
  }
  CHECK(looplock::signal_name(SIGUSR1) == "USR1");
  CHECK(looplock::signal_name(SIGRTMIN + 3) == "RTMIN+3");
  for (int sig : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGRTMIN + 1}) {
    CHECK(looplock::parse_signal(looplock::signal_name(sig)) == sig);
  }
}
