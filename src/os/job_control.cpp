#include "os/job_control.hpp"

#include <cerrno>

namespace looplock::sys {

bool exec_not_found(int err) { return err == ENOENT || err == ENOTDIR || err == ENAMETOOLONG; }

}  // namespace looplock::sys
