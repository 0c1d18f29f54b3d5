// The one error type that ends a run: what failed, why, a hint, and the exit
// status it maps to. main() catches it once and prints it in the one message
// style: "looplock: <what failed>: <why>" and, on its own line, the hint.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "os/failure.hpp"

namespace looplock {

class Fatal : public std::runtime_error {
public:
  Fatal(int exit_status, std::string message, std::string hint = {}, std::string event = {})
      : std::runtime_error(std::move(message)),
        status_(exit_status),
        hint_(std::move(hint)),
        event_(std::move(event)) {}

  int status() const noexcept { return status_; }
  const std::string& hint() const noexcept { return hint_; }
  // The --log-format json event: the one given, else the exit status's
  // (default_event()).
  std::string event() const { return event_.empty() ? std::string(default_event(status_)) : event_; }

  // usage_error (64), dir_missing (66), etcd_unreachable (69), os_error (71),
  // lock_file_unusable (73), command_not_executable (126),
  // command_not_found (127), error (anything else).
  static std::string_view default_event(int status) noexcept;

private:
  int status_;
  std::string hint_;
  std::string event_;
};

// "<what>: <strerror(err)>"
std::string errno_message(const std::string& what, int err);

// Throws Fatal(status, what + ": " + strerror(err), hint, event).
[[noreturn]] void fail_errno(int status, const std::string& what, int err, std::string hint = {},
                             std::string event = {});

// A recoverable failure's message: its what, with strerror(err) when it has
// an errno ("<what>: <strerror(err)>").
std::string failure_message(const sys::Failure& f);

// Throws Fatal(status, failure_message(f), f.hint, event) for a recoverable
// failure that ends the run after all.
[[noreturn]] void fail(int status, const sys::Failure& f, std::string event = {});

// Writes `text` to standard output; throws Fatal 71 naming the failure
// (a closed stdout, a full disk, /dev/full). A closed pipe (EPIPE) kills
// looplock with SIGPIPE first, as it kills any filter.
void write_stdout(std::string_view text);

// The status for a failed system call: 71 (EX_OSERR) for resource exhaustion
// and kernel failures, `otherwise` for everything else.
int status_for_errno(int err, int otherwise);

}  // namespace looplock
