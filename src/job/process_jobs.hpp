// The JobRunner of the operating system's jobs (os/job_control.hpp), each
// run under job_loop.hpp's loop; Run's unit tests use a fake instead.
#pragma once

#include <memory>

#include "job/job.hpp"

namespace looplock {

std::unique_ptr<JobRunner> process_jobs();

}  // namespace looplock
