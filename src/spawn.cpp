#include "spawn.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "error.hpp"
#include "exit_codes.hpp"
#include "sys.hpp"

namespace looplock {

namespace {

constexpr int kFixedForwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
                                   SIGALRM, SIGPIPE, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ};

// Restores what the command must start with. Async-signal-safe calls only
// (this runs between fork and exec).
void restore_in_child(const InheritedSignals& inherited) {
  sigaction(SIGCHLD, &inherited.chld, nullptr);
  sigaction(SIGPIPE, &inherited.pipe, nullptr);
  sigaction(SIGXFSZ, &inherited.xfsz, nullptr);
  sigprocmask(SIG_SETMASK, &inherited.mask, nullptr);
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string exec_hint(int err, const std::string& name) {
  if (err == ENOENT) {
    return name.find('/') == std::string::npos ? "Check the name and PATH, or give the command's full path."
                                               : "Check the path.";
  }
  if (err == EACCES) return "Check that it is a file with execute permission (chmod +x).";
  return {};
}

[[noreturn]] void exec_failed(const std::string& name, int err) {
  throw Fatal(exec_failure_status(err), errno_message("cannot run '" + name + "'", err), exec_hint(err, name));
}

// The command's own ^C: a tty's INT, QUIT or hangup reaches its whole
// foreground process group, the command included, with si_code SI_KERNEL.
bool already_delivered_to_group(const siginfo_t& info) {
  return info.si_code == SI_KERNEL &&
         (info.si_signo == SIGINT || info.si_signo == SIGQUIT || info.si_signo == SIGHUP);
}

}  // namespace

sigset_t forwarded_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kFixedForwarded) sigaddset(&set, s);
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) sigaddset(&set, s);
  return set;
}

InheritedSignals take_signal_control() {
  InheritedSignals in;
  sigprocmask(SIG_SETMASK, nullptr, &in.mask);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, &in.chld);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &in.pipe);
  sigaction(SIGXFSZ, &ign, &in.xfsz);
  sigset_t ending;
  sigemptyset(&ending);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&ending, s);
  sigprocmask(SIG_UNBLOCK, &ending, nullptr);
  return in;
}

bool in_terminal_foreground() {
  const pid_t group = getpgrp();
  for (int fd : {0, 1, 2}) {
    pid_t fg = tcgetpgrp(fd);  // fails unless fd is our controlling terminal
    if (fg >= 0) return fg == group;
  }
  return false;
}

int exec_failure_status(int err) {
  return (err == ENOENT || err == ENOTDIR || err == ENAMETOOLONG) ? exit_code::kNotFound
                                                                  : exit_code::kNotExecutable;
}

int run_command(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);

  sigset_t waited = forwarded_signals();
  sigaddset(&waited, SIGCHLD);
  sigset_t before;
  sigprocmask(SIG_BLOCK, &waited, &before);

  const pid_t parent = getpid();
  // When the command gets the lock fd, become the subreaper of its
  // descendants: a background process it leaves behind is then found (and
  // reaped) here, so that a lock it keeps holding can be reported.
  if (spec.pass_fd >= 0) prctl(PR_SET_CHILD_SUBREAPER, 1);

  // vfork: the child borrows looplock's memory until it has exec'd (or
  // failed to), which is cheaper than copying it, and lets it hand back the
  // exec errno through this variable instead of a pipe. Between vfork and
  // exec the child only makes system calls (no allocation, no locks), and
  // looplock is suspended meanwhile.
  const bool own_group = !in_terminal_foreground();
  volatile int exec_errno = 0;
  pid_t child = vfork();
  if (child < 0) {
    int err = errno;
    sigprocmask(SIG_SETMASK, &before, nullptr);
    fail_errno(exit_code::kOsError, "cannot start the command (vfork)", err);
  }
  if (child == 0) {
    // The command must not outlive looplock: it would run on unprotected.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(exit_code::kOsError);
    if (own_group) setpgid(0, 0);
    if (spec.pass_fd >= 0) fcntl(spec.pass_fd, F_SETFD, 0);
    restore_in_child(inherited);
    execvpe(argv[0], argv.data(), envp.data());
    exec_errno = errno;
    _exit(exec_failure_status(errno));
  }
  const bool exec_failed_in_child = exec_errno != 0;

  const sigset_t forwarded = forwarded_signals();
  const pid_t self = getpid();
  long long kill_at = 0;  // monotonic ns at which KILL is due; 0: none
  bool kill_group = false;
  bool lost = false;
  bool ticking = spec.tick && spec.tick_interval_ns > 0;
  long long next_tick = sys::monotonic_ns() + spec.tick_interval_ns;
  int status = 0;
  for (bool done = false;;) {
    // Reap the command and any orphaned descendant handed to us.
    for (;;) {
      int st = 0;
      pid_t r = sys::retry_eintr([&] { return waitpid(-1, &st, WNOHANG); });
      if (r <= 0) {
        if (r < 0 && errno != ECHILD) fail_errno(exit_code::kOsError, "cannot wait for the command", errno);
        break;
      }
      if (r == child) {
        status = st;
        done = true;
      }
    }
    if (done) break;

    if (ticking && sys::monotonic_ns() >= next_tick) {
      if (spec.tick()) {
        next_tick = sys::monotonic_ns() + spec.tick_interval_ns;
      } else {
        // Lost: the command no longer runs under the lock. Its own process
        // group when it has one (what it started goes too), else itself.
        ticking = false;
        lost = true;
        if (own_group) kill(-child, SIGTERM);
        kill(child, SIGTERM);
        const long long at = sys::monotonic_ns() + spec.tick_kill_after_ns;
        if (kill_at == 0 || at < kill_at) kill_at = at;
        kill_group = own_group;
      }
      continue;
    }

    siginfo_t info{};
    int sig;
    if (kill_at != 0 || ticking) {
      const long long now = sys::monotonic_ns();
      if (kill_at != 0 && kill_at - now <= 0) {
        log.warn("kill_after", lost ? "the command did not end within --kill-after (default 5s) of the TERM sent when "
                                      "the lease was lost; sending KILL"
                                    : "the command did not end within --kill-after of TERM/INT; sending KILL");
        if (kill_group) kill(-child, SIGKILL);
        kill(child, SIGKILL);
        kill_at = 0;
        continue;
      }
      long long until = kill_at != 0 ? kill_at : next_tick;
      if (ticking && next_tick < until) until = next_tick;
      long long left = std::max(until - now, 1LL);
      timespec ts{static_cast<time_t>(left / 1'000'000'000LL), static_cast<long>(left % 1'000'000'000LL)};
      sig = sigtimedwait(&waited, &info, &ts);
    } else {
      sig = sigwaitinfo(&waited, &info);
    }
    if (sig < 0 || sig == SIGCHLD) continue;  // EINTR/EAGAIN, or a child changed state
    if (!sigismember(&forwarded, sig)) continue;
    bool own = (info.si_code == SI_USER || info.si_code == SI_TKILL) && info.si_pid == self;
    if (!own && !(!own_group && already_delivered_to_group(info))) kill(child, sig);
    if ((sig == SIGTERM || sig == SIGINT) && spec.kill_after_ns && kill_at == 0) {
      kill_at = sys::monotonic_ns() + *spec.kill_after_ns;
    }
  }
  sigprocmask(SIG_SETMASK, &before, nullptr);
  if (exec_failed_in_child) exec_failed(spec.argv[0], exec_errno);
  return status;
}

void exec_command(const CommandSpec& spec, const InheritedSignals& inherited) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  if (spec.pass_fd >= 0) fcntl(spec.pass_fd, F_SETFD, 0);
  restore_in_child(inherited);
  execvpe(argv[0], argv.data(), envp.data());
  int err = errno;
  exec_failed(spec.argv[0], err);
}

int shell_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return exit_code::kOsError;
}

void exit_like(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    // Die of the same signal, so the caller sees what it would see without
    // looplock; but never leave a core file of looplock's own.
    struct rlimit no_core {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
  }
  _exit(shell_status(wait_status));
}

}  // namespace looplock
