#include "cli/cluster_exec.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"

#ifndef LOOPLOCK_HELPER_DIR
#define LOOPLOCK_HELPER_DIR "/usr/local/libexec/looplock"
#endif

namespace looplock {

namespace {
constexpr long long kMaxHandOverNs = 60'000'000'000LL;
constexpr std::string_view kInstallHint = "install the looplock-etcd package";

// Where this executable looks for looplock-etcd.
std::vector<std::string> installed_helper_paths() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self);
  // Unknown (no /proc) or cut short: only the install's directory is tried.
  const std::string_view self_exe(self, n > 0 && static_cast<size_t>(n) < sizeof self ? static_cast<size_t>(n) : 0);
  return cluster_helper_paths(self_exe, LOOPLOCK_HELPER_DIR);
}

}  // namespace

std::vector<std::string> cluster_helper_paths(std::string_view self_exe, std::string_view libexec_dir) {
  std::vector<std::string> out;
  if (auto slash = self_exe.rfind('/'); slash != std::string_view::npos && self_exe.starts_with('/')) {
    out.push_back(std::string(self_exe.substr(0, slash + 1)) + std::string(kClusterHelperName));
  }
  if (!libexec_dir.empty()) {
    std::string p =
        std::string(libexec_dir) + (libexec_dir.ends_with('/') ? "" : "/") + std::string(kClusterHelperName);
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  }
  return out;
}

std::string cluster_helper_status() {
  const auto paths = installed_helper_paths();
  for (const auto& path : paths) {
    if (access(path.c_str(), F_OK) != 0) continue;
    if (access(path.c_str(), X_OK) != 0) {
      return "not available: " + path + " cannot be executed (" + std::string(std::strerror(errno)) + ")";
    }
    return "available, through " + path;
  }
  return "not available: " + std::string(kClusterHelperName) + " is not installed (looked for " + join(paths) + "); " +
         std::string(kInstallHint);
}

void exec_cluster_helper(char** argv, const EnvList& env, long long start_ns) {
  EnvList handed = env_with(env, {{env_name::kStartNs, std::to_string(start_ns)}});
  std::vector<char*> envp;
  envp.reserve(handed.size() + 1);
  for (auto& e : handed) envp.push_back(e.data());
  envp.push_back(nullptr);

  const auto paths = installed_helper_paths();
  std::string failed;  // the first that exists but cannot be executed
  int failed_errno = 0;
  for (const auto& path : paths) {
    execve(path.c_str(), argv, envp.data());
    if (errno != ENOENT && failed.empty()) {
      failed = path;
      failed_errno = errno;
    }
  }
  if (!failed.empty()) {
    fail_errno(exit_code::kOsError, "cannot run " + failed + " for --etcd", failed_errno,
               "Check that looplock-etcd is installed whole (the file and its mode).");
  }
  throw Fatal(exit_code::kClusterUnavailable,
              "cluster locking (--etcd or $LOOPLOCK_ETCD) needs " + std::string(kClusterHelperName) +
                  ", which is not installed (looked for " + join(paths) + ")",
              "Install the looplock-etcd package (apt-get install looplock-etcd), or from source build with "
              "libcurl (meson setup -Detcd=enabled) and install it; or run without --etcd and without "
              "$LOOPLOCK_ETCD. The command did not run.",
              "etcd_helper_missing");
}

std::optional<long long> take_handed_start(EnvList& env, long long now_ns) {
  auto text = env_get(env, env_name::kStartNs);
  if (!text) return std::nullopt;
  env = env_with(env, {}, {env_name::kStartNs});
  long long v = 0;
  auto [p, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || p != text->data() + text->size() || v <= 0 || v > now_ns || now_ns - v > kMaxHandOverNs) {
    return std::nullopt;
  }
  return v;
}

}  // namespace looplock
