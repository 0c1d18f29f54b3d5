// What --version prints: the version, the commit the build came from, how
// the executable is linked, and what --etcd would run. Nothing here runs
// unless --version is asked for.
#pragma once

#include <string>
#include <string_view>

namespace looplock {

struct BuildInfo {
  std::string_view version;  // meson's project version
  std::string_view commit;   // git describe, the tarball's .commit, or "unknown"
  std::string_view linking;  // "static", "static except libc", "dynamic", ...
};

// The build of looplock, or of looplock-etcd (always linked dynamically: it
// carries libcurl).
BuildInfo build_info(bool cluster_helper);

// The --version text; `etcd` says whether --etcd is available and through
// which looplock-etcd (cluster_helper_status()).
std::string version_text(const BuildInfo& build, std::string_view etcd);

}  // namespace looplock
