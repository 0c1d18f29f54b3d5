#include "base/error.hpp"

#include <cerrno>
#include <cstring>

#include "base/exit_codes.hpp"
#include "os/sys.hpp"

namespace looplock {

std::string errno_message(const std::string& what, int err) { return what + ": " + std::strerror(err); }

void fail_errno(int status, const std::string& what, int err, std::string hint, std::string event) {
  throw Fatal(status, errno_message(what, err), std::move(hint), std::move(event));
}

std::string failure_message(const sys::Failure& f) { return f.err != 0 ? errno_message(f.what, f.err) : f.what; }

void fail(int status, const sys::Failure& f, std::string event) {
  throw Fatal(status, failure_message(f), f.hint, std::move(event));
}

void write_stdout(std::string_view text) {
  if (!sys::write_all(1, text)) {
    throw Fatal(exit_code::kOsError, errno_message("cannot write to standard output", errno),
                "Check where standard output goes (a full disk, a closed descriptor).", "stdout_write_failed");
  }
}

std::string_view Fatal::default_event(int status) noexcept {
  switch (status) {
    case exit_code::kUsage: return "usage_error";
    case exit_code::kNoInput: return "dir_missing";
    case exit_code::kClusterUnavailable: return "etcd_unreachable";
    case exit_code::kOsError: return "os_error";
    case exit_code::kCantCreate: return "lock_file_unusable";
    case exit_code::kNotExecutable: return "command_not_executable";
    case exit_code::kNotFound: return "command_not_found";
    default: return "error";
  }
}

int status_for_errno(int err, int otherwise) {
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOLCK:
    case EAGAIN:
    case EIO: return exit_code::kOsError;
    default: return otherwise;
  }
}

}  // namespace looplock
