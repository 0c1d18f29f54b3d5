// The hand-over to looplock-etcd: where it is looked for, and the start time
// it receives (exec_cluster_helper itself is tested by test_etcd.py).
#include <doctest/doctest.h>

#include "cli/cluster_exec.hpp"

using namespace looplock;

TEST_CASE("looplock-etcd is looked for beside looplock, then in the install's libexec dir") {
  auto p = cluster_helper_paths("/opt/x/bin/looplock", "/usr/libexec/looplock");
  REQUIRE(p.size() == 2);
  CHECK(p[0] == "/opt/x/bin/looplock-etcd");
  CHECK(p[1] == "/usr/libexec/looplock/looplock-etcd");
  CHECK(cluster_helper_paths("/usr/libexec/looplock/looplock", "/usr/libexec/looplock/").size() == 1);
  // An unknown executable path (no /proc): only the install's.
  CHECK(cluster_helper_paths("", "/usr/libexec/looplock") ==
        std::vector<std::string>{"/usr/libexec/looplock/looplock-etcd"});
}

TEST_CASE("the handed start time: taken when believable, removed from the environment always") {
  const Instant now = instant_ns(100'000'000'000LL);
  EnvList env{"A=1", "LOOPLOCK_START_NS=99000000000", "B=2"};
  CHECK(take_handed_start(env, now) == instant_ns(99'000'000'000LL));
  CHECK(env == EnvList{"A=1", "B=2"});
  CHECK_FALSE(take_handed_start(env, now));  // gone

  for (const char* bad : {"LOOPLOCK_START_NS=", "LOOPLOCK_START_NS=x", "LOOPLOCK_START_NS=-5", "LOOPLOCK_START_NS=0",
                          "LOOPLOCK_START_NS=100000000001",  // in the future
                          "LOOPLOCK_START_NS=1000",          // long ago
                          "LOOPLOCK_START_NS=99000000000 "}) {
    CAPTURE(bad);
    EnvList e{bad};
    CHECK_FALSE(take_handed_start(e, now));
    CHECK(e.empty());
  }
}
