// Shared helpers for the unit tests: a temporary directory per test case,
// kept when the test failed (for a look at what was left), and small file
// utilities. Include after <doctest/doctest.h>; one test file per executable.
#pragma once

#include <doctest/doctest.h>

#include "os/ids.hpp"
#include "samples.hpp"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace testutil {

// Set by the listener below when an assertion of the current test case fails.
inline bool g_current_test_failed = false;

struct FailureListener : public doctest::IReporter {
  explicit FailureListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { g_current_test_failed = false; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override { g_current_test_failed = true; }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& a) override {
    if (a.m_failed) g_current_test_failed = true;
  }
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

DOCTEST_REGISTER_LISTENER("looplock-failure-listener", 1, FailureListener);

// The signal state of the test process, put back after a test that changes
// it in-process, so that doctest is left as it was found.
struct SignalStateGuard {
  sigset_t mask{};
  struct sigaction chld {};
  struct sigaction pipe {};
  SignalStateGuard() {
    sigprocmask(SIG_BLOCK, nullptr, &mask);
    sigaction(SIGCHLD, nullptr, &chld);
    sigaction(SIGPIPE, nullptr, &pipe);
  }
  ~SignalStateGuard() {
    sigaction(SIGCHLD, &chld, nullptr);
    sigaction(SIGPIPE, &pipe, nullptr);
    sigprocmask(SIG_SETMASK, &mask, nullptr);
  }
};

// A fresh directory under $TMPDIR (or /tmp), removed at the end of the scope
// unless an assertion of the current test case failed.
class TempDir {
public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/looplock-unit-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    if (g_current_test_failed) {
      std::cerr << "testutil: keeping " << path_ << " of the failed test\n";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& content, mode_t mode = 0644) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      ::close(fd);
      throw std::runtime_error("cannot write " + path);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

inline std::optional<std::string> slurp(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

inline bool fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

// Waits for a child with a timeout (a hang fails instead of wedging the run):
// returns its wait status, or nullopt after killing it when it did not end.
inline std::optional<int> wait_child(looplock::Pid pid, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    looplock::Pid r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    usleep(2000);
  }
}

// Reads until `want` was seen or the timeout passed (for "ready" handshakes).
inline bool read_until(int fd, const std::string& want, int timeout_ms = 10000) {
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (got.find(want) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace testutil
