#include "job/process_jobs.hpp"

#include <memory>
#include <variant>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "job/job_loop.hpp"
#include "os/job_control.hpp"

namespace looplock {

namespace {

// Jobs as the operating system runs them (os/job_control.hpp): looplock's
// signal state taken once, and what it inherited given back to each command.
class ProcessJobs final : public JobRunner {
public:
  void take_control(Pid self) override {
    auto taken = sys::take_job_control(self);
    if (auto* f = std::get_if<sys::Failure>(&taken)) fail(exit_code::kOsError, *f);
    control_ = std::get<std::unique_ptr<sys::JobControl>>(std::move(taken));
  }
  JobEnd run(const CommandSpec& spec, const Logger& log) override { return run_command(spec, *control_, log); }
  [[noreturn]] void exec(const CommandSpec& spec) override { exec_command(spec, *control_); }
  [[noreturn]] void exit_like(int status) override { sys::exit_like(status, shell_status(status)); }

private:
  std::unique_ptr<sys::JobControl> control_;
};

}  // namespace

std::unique_ptr<JobRunner> process_jobs() { return std::make_unique<ProcessJobs>(); }

}  // namespace looplock
