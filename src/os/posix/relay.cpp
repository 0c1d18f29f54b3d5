#include "os/relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "os/clock.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {

// A child's signals as a fresh process has them: none blocked, every
// disposition the default (looplock takes its own signals for the run).
void plain_signals() {
  sigset_t none;
  sigemptyset(&none);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
  }
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::optional<Relay> start_relay(const std::function<int(int events)>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = err;
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(fds[1]);
    setpgid(0, 0);
    plain_signals();
    signal(SIGPIPE, SIG_IGN);  // a notifier that does not read its event
    _exit(body(fds[0]));
  }
  ::close(fds[0]);
  // Room for the events of a run while a notifier is slow (1 MiB where the
  // system allows it; 64 KiB otherwise); looplock never waits for it.
  (void)fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  (void)fcntl(fds[1], F_SETFL, O_NONBLOCK);
  Relay relay;
  relay.events = UniqueFd(fds[1]);
  relay.pid = pid;
  return relay;
}

namespace {

constexpr size_t kMaxPending = 1 << 20;

// Writes what is pending, as much as the pipe takes now.
void flush_pending(Relay& relay) {
  while (!relay.pending.empty() && relay.events) {
    const ssize_t n = ::write(relay.events.get(), relay.pending.data(), relay.pending.size());
    if (n > 0) {
      relay.pending.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {  // the relay is gone (EPIPE): the rest is lost
      relay.events.reset();
      relay.pending.clear();
    }
  }
}

// Writes as much of `input` from `sent` as the notifier has read room for
// (fd non-blocking); once all of it is sent, or the notifier closed its
// standard input (EPIPE), closes fd and sets it to -1.
void feed_input(int& fd, const std::string& input, size_t& sent) {
  while (fd >= 0 && sent < input.size()) {
    const ssize_t n = ::write(fd, input.data() + sent, input.size() - sent);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      break;  // EPIPE: it does not read its event
    }
  }
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

bool ending_signal_pending() {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    if (sigismember(&pending, s) == 1) return true;
  }
  return false;
}

}  // namespace

void send_event(Relay& relay, std::string line) {
  if (!relay.events) return;
  if (relay.pending.size() + line.size() > kMaxPending) {
    ++relay.dropped;
    return;
  }
  relay.pending += line;
  flush_pending(relay);
}

void finish_relay(Relay& relay) {
  if (relay.pid <= 0) {
    relay.events.reset();
    return;
  }
  for (int status = 0;;) {
    flush_pending(relay);
    if (relay.pending.empty()) relay.events.reset();
    const pid_t r = waitpid(relay.pid, &status, WNOHANG);
    if (r == relay.pid || (r < 0 && errno != EINTR)) break;
    if (ending_signal_pending()) break;  // the relay delivers the rest on its own
    if (relay.events) {
      pollfd p{relay.events.get(), POLLOUT, 0};
      (void)poll(&p, 1, 10);
    } else {
      nap(std::chrono::milliseconds(10));
    }
  }
  relay.events.reset();
  relay.pid = 0;
}

bool wait_readable(int fd, Deadline until) {
  for (;;) {
    int ms = -1;
    if (until) {
      const Duration left = *until - MonotonicClock::now();
      if (left <= Duration::zero()) return false;
      ms = static_cast<int>(std::min<long long>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the read say what is wrong
  }
}

std::optional<std::string> read_some(int fd, size_t limit) {
  std::string buf(limit, '\0');
  const ssize_t n = retry_eintr([&] { return ::read(fd, buf.data(), buf.size()); });
  if (n < 0) return std::nullopt;
  buf.resize(static_cast<size_t>(n));
  return buf;
}

NotifierEnd run_notifier(const std::string& command, const std::vector<std::string>& env, const std::string& input,
                         Duration timeout) {
  constexpr size_t kKept = 1024;
  NotifierEnd end;
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC | O_NONBLOCK) != 0) {
    end.err = errno;
    return end;
  }
  if (pipe2(out, O_CLOEXEC | O_NONBLOCK) != 0) {
    end.err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return end;
  }
  const std::vector<std::string> argv{"/bin/sh", "-c", command};
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  const pid_t pid = fork();
  if (pid < 0) {
    end.err = errno;
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return end;
  }
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    for (int fd : {in[0], out[1]}) {  // the notifier's ends block, as a fresh pipe's do
      const int flags = fcntl(fd, F_GETFL);
      if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) _exit(126);
    execve("/bin/sh", c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid, pid);  // as the child does: no race with the KILL below
  ::close(in[0]);
  ::close(out[1]);
  end.started = true;
  // The deadline starts before the first byte of the event is written.
  const Deadline deadline = later(MonotonicClock::now(), timeout);  // saturates: kForever never comes
  int to_notifier = in[1];
  size_t sent = 0;
  auto feed = [&] { feed_input(to_notifier, input, sent); };
  auto drain = [&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
      end.output.append(buf, static_cast<size_t>(n));
      if (end.output.size() > kKept) end.output.erase(0, end.output.size() - kKept);
    }
  };
  for (;;) {
    feed();
    drain();
    const pid_t r = waitpid(pid, &end.status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (deadline && MonotonicClock::now() >= *deadline) {
      end.timed_out = true;
      kill(-pid, SIGKILL);
      while (waitpid(pid, &end.status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    pollfd p[2] = {{out[0], POLLIN, 0}, {to_notifier, POLLOUT, 0}};  // a negative fd is skipped
    (void)poll(p, 2, 5);
  }
  drain();
  if (to_notifier >= 0) ::close(to_notifier);
  ::close(out[0]);
  // What the notifier left in its group goes with it.
  kill(-pid, SIGKILL);
  return end;
}

}  // namespace looplock::sys
