// --version: one fact per line, the version first (scripts read line 1).
#include <doctest/doctest.h>

#include "cli/version.hpp"

using namespace looplock;

TEST_CASE("the version text: version, commit, linking and --etcd, one per line") {
  BuildInfo b{"1.2.3", "0123456789ab-dirty", "static"};
  CHECK(version_text(b, "available, through /usr/libexec/looplock/looplock-etcd") ==
        "looplock 1.2.3\n"
        "commit: 0123456789ab-dirty\n"
        "linked: static\n"
        "--etcd: available, through /usr/libexec/looplock/looplock-etcd\n");
}

TEST_CASE("the build's own facts") {
  const BuildInfo looplock = build_info(false);
  CHECK_FALSE(looplock.version.empty());
  CHECK_FALSE(looplock.commit.empty());
  CHECK_FALSE(looplock.linking.empty());
  CHECK(build_info(true).linking == "dynamic");  // looplock-etcd carries libcurl
  CHECK(build_info(true).commit == looplock.commit);
}
