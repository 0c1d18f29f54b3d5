#include "base/environment.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using looplock::EnvList;

TEST_CASE("env_from copies a NULL-terminated environment") {
  char a[] = "A=1";
  char b[] = "B=two=2";
  char c[] = "EMPTY=";
  char* envp[] = {a, b, c, nullptr};
  CHECK(looplock::env_from(envp) == EnvList{"A=1", "B=two=2", "EMPTY="});
  char* none[] = {nullptr};
  CHECK(looplock::env_from(none).empty());
  CHECK(looplock::env_from(nullptr).empty());
}

TEST_CASE("env_get matches the whole name") {
  EnvList env = {
      "LOOPLOCK_FDX=9", "LOOPLOCK_FD=3", "XLOOPLOCK_DIR=/x", "EMPTY=", "NOEQUALS", "DUP=first", "DUP=second", "EQ==v"};
  CHECK(looplock::env_get(env, "LOOPLOCK_FD") == "3");
  CHECK(looplock::env_get(env, "LOOPLOCK_FDX") == "9");
  CHECK_FALSE(looplock::env_get(env, "LOOPLOCK_F"));
  CHECK_FALSE(looplock::env_get(env, "LOOPLOCK_DIR"));
  CHECK(looplock::env_get(env, "EMPTY") == "");
  CHECK_FALSE(looplock::env_get(env, "NOEQUALS"));
  CHECK(looplock::env_get(env, "DUP") == "first");
  CHECK(looplock::env_get(env, "EQ") == "=v");
  CHECK_FALSE(looplock::env_get(env, "MISSING"));
  CHECK_FALSE(looplock::env_get({}, "A"));
}

TEST_CASE("env_with replaces, adds and removes") {
  EnvList env = {"PATH=/bin",  "LOOPLOCK_FD=7", "LOOPLOCK_FDX=keep", "LOOPLOCK_HOLDER_PID=1",
                 "HOME=/root", "LOOPLOCK_FD=8"};
  EnvList out = looplock::env_with(env, {{looplock::env_name::kFd, "3"}, {looplock::env_name::kDir, "/srv/loop"}},
                                   {looplock::env_name::kHolderPid, "NOT_THERE"});
  CHECK(out == EnvList{"PATH=/bin", "LOOPLOCK_FDX=keep", "HOME=/root", "LOOPLOCK_FD=3", "LOOPLOCK_DIR=/srv/loop"});
  CHECK(looplock::env_get(out, "LOOPLOCK_FD") == "3");
  // The input is not changed.
  CHECK(env.size() == 6);
  // Nothing to do.
  CHECK(looplock::env_with(env, {}) == env);
  // A value with '=' and an empty value.
  out = looplock::env_with({}, {{"A", "x=y"}, {"B", ""}});
  CHECK(out == EnvList{"A=x=y", "B="});
}

TEST_CASE("the exported names") {
  CHECK(looplock::env_name::kFd == "LOOPLOCK_FD");
  CHECK(looplock::env_name::kDir == "LOOPLOCK_DIR");
  CHECK(looplock::env_name::kLockId == "LOOPLOCK_LOCK_ID");
  CHECK(looplock::env_name::kPolicy == "LOOPLOCK_POLICY");
  CHECK(looplock::env_name::kAgent == "LOOPLOCK_AGENT");
  CHECK(looplock::env_name::kHolderPid == "LOOPLOCK_HOLDER_PID");
  CHECK(looplock::env_name::kHolderFd == "LOOPLOCK_HOLDER_FD");
}

TEST_CASE("LOOPLOCK_DEADLINE: seconds with milliseconds, read back strictly") {
  CHECK(looplock::format_deadline(1796171903089LL) == "1796171903.089");
  CHECK(looplock::format_deadline(1796171903000LL) == "1796171903.000");
  CHECK(looplock::format_deadline(5LL) == "0.005");
  CHECK(looplock::parse_deadline(std::string("1796171903.089")) == 1796171903089LL);
  CHECK(looplock::parse_deadline(looplock::format_deadline(42)) == 42);
  CHECK_FALSE(looplock::parse_deadline(std::nullopt));
  for (const char* bad : {"", "1796171903", "1796171903.08", "1796171903.0891", ".089", "-1.000", "1e3.000", "12.a00",
                          "12.00 ", " 12.000", "99999999999999999999.000"}) {
    CHECK_MESSAGE(!looplock::parse_deadline(std::string(bad)), bad);
  }
}

TEST_CASE("LOOPLOCK_DEADLINE_OWNER: PID:START, read back strictly") {
  CHECK(looplock::format_deadline_owner(4242, "68907") == "4242:68907");
  const auto o = looplock::parse_deadline_owner(std::string("4242:68907"));
  REQUIRE(o);
  CHECK(o->pid == 4242);
  CHECK(o->start == "68907");
  CHECK_FALSE(looplock::parse_deadline_owner(std::nullopt));
  for (const char* bad : {"", "4242", "4242:", ":68907", "0:1", "-5:1", "12a:1", "1:2x", "1:-2", "1:2:3"}) {
    CHECK_MESSAGE(!looplock::parse_deadline_owner(std::string(bad)), bad);
  }
}
