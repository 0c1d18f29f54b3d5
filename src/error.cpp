#include "error.hpp"

#include <cerrno>
#include <cstring>

#include "exit_codes.hpp"
#include "sys.hpp"

namespace looplock {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

void fail_errno(int status, const std::string& what, int err, std::string hint) {
  throw Fatal(status, errno_message(what, err), std::move(hint));
}

void write_stdout(std::string_view text) {
  if (!sys::write_all(1, text)) {
    fail_errno(exit_code::kOsError, "cannot write to standard output", errno,
               "Check where standard output goes (a full disk, a closed descriptor).");
  }
}

int status_for_errno(int err, int otherwise) {
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOLCK:
    case EAGAIN:
    case EIO:
      return exit_code::kOsError;
    default:
      return otherwise;
  }
}

}  // namespace looplock
