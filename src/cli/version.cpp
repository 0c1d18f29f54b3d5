#include "cli/version.hpp"

#include "cli/commit.h"

#ifndef LOOPLOCK_VERSION
#define LOOPLOCK_VERSION "unknown"
#endif
#ifndef LOOPLOCK_LINKING
#define LOOPLOCK_LINKING "unknown"
#endif
#ifndef LOOPLOCK_HELPER_LINKING
#define LOOPLOCK_HELPER_LINKING "dynamic"
#endif

namespace looplock {

BuildInfo build_info(bool cluster_helper) {
  return {LOOPLOCK_VERSION, LOOPLOCK_COMMIT, cluster_helper ? LOOPLOCK_HELPER_LINKING : LOOPLOCK_LINKING};
}

std::string version_text(const BuildInfo& build, std::string_view etcd) {
  std::string out = "looplock ";
  out.append(build.version).append("\ncommit: ").append(build.commit);
  out.append("\nlinked: ").append(build.linking);
  out.append("\n--etcd: ").append(etcd).append("\n");
  return out;
}

}  // namespace looplock
