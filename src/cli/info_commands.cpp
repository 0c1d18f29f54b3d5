#include "cli/info_commands.hpp"

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "cli/cluster_exec.hpp"
#include "cli/completions.hpp"
#include "cli/options.hpp"
#include "cli/version.hpp"

namespace looplock {

int help_command(Session&) {
  write_stdout(help_text());
  return exit_code::kOk;
}

int version_command(Session& s) {
  const bool helper = s.ctx.cluster != nullptr;  // this is looplock-etcd
  const std::string etcd_status = helper ? "available, built in (this is looplock-etcd)" : cluster_helper_status();
  write_stdout(version_text(build_info(helper), etcd_status));
  return exit_code::kOk;
}

int completions_command(Session& s) {
  write_stdout(*completion_script(s.options.completions));
  return exit_code::kOk;
}

}  // namespace looplock
