#include "records/lock_id.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "os/digest.hpp"
#include "testutil.hpp"

using testutil::TempDir;

namespace {
std::string real(const std::string& p) {
  char* r = realpath(p.c_str(), nullptr);
  REQUIRE(r);
  std::string out = r;
  std::free(r);
  return out;
}
}  // namespace

TEST_CASE("lock_id_for_path is the first 16 hex digits of the SHA-256") {
  CHECK(looplock::lock_id_for_path("abc") == "ba7816bf8f01cfea");
  CHECK(looplock::lock_id_for_path("") == "e3b0c44298fc1c14");
  std::string id = looplock::lock_id_for_path("/srv/loops/nightly/.state.lock");
  CHECK(id.size() == 16);
  CHECK(id == looplock::sys::sha256_hex("/srv/loops/nightly/.state.lock").substr(0, 16));
  CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(id.find("srv") == std::string::npos);
  CHECK(looplock::lock_id_for_path("/srv/loops/other/.state.lock") != id);
}

TEST_CASE("canonical_lock_path resolves symlinks, dots and trailing slashes") {
  TempDir dir;
  const std::string canon = real(dir.path()) + "/.state.lock";
  CHECK(looplock::canonical_lock_path(dir.path()) == canon);
  CHECK(looplock::canonical_lock_path(dir.path() + "/") == canon);
  CHECK(looplock::canonical_lock_path(dir.path() + "//") == canon);
  CHECK(looplock::canonical_lock_path(dir.path() + "/./") == canon);
  REQUIRE(mkdir((dir / "sub").c_str(), 0755) == 0);
  CHECK(looplock::canonical_lock_path(dir / "sub/..") == canon);
  REQUIRE(symlink(dir.path().c_str(), (dir / "link").c_str()) == 0);
  CHECK(looplock::canonical_lock_path(dir / "link") == canon);
  CHECK(looplock::canonical_lock_path(dir / "link/") == canon);
  CHECK(looplock::canonical_lock_path(dir / "sub") == real(dir / "sub") + "/.state.lock");

  // A relative path resolves against the working directory.
  char cwd[PATH_MAX];
  REQUIRE(getcwd(cwd, sizeof cwd));
  REQUIRE(chdir(dir.path().c_str()) == 0);
  CHECK(looplock::canonical_lock_path(".") == canon);
  CHECK(looplock::canonical_lock_path("sub/../") == canon);
  REQUIRE(chdir(cwd) == 0);

  // The same lock, the same id, whichever way it is named.
  CHECK(looplock::lock_id_for_path(looplock::canonical_lock_path(dir / "link/")) ==
        looplock::lock_id_for_path(looplock::canonical_lock_path(dir.path())));

  CHECK(looplock::canonical_lock_path("/") == "/.state.lock");
}

TEST_CASE("canonical_lock_path falls back to the absolute spelling when DIR cannot be resolved") {
  TempDir dir;
  CHECK(looplock::canonical_lock_path(dir / "missing") == dir / "missing/.state.lock");
  CHECK(looplock::canonical_lock_path(dir / "missing//") == dir / "missing/.state.lock");
  char cwd[PATH_MAX];
  REQUIRE(getcwd(cwd, sizeof cwd));
  REQUIRE(chdir(dir.path().c_str()) == 0);
  std::string rel = looplock::canonical_lock_path("missing/");
  REQUIRE(chdir(cwd) == 0);
  CHECK(rel == real(dir.path()) + "/missing/.state.lock");
  CHECK(rel.front() == '/');
}

TEST_CASE("lexically_normal drops . and .. without asking the file system") {
  CHECK(looplock::lexically_normal("/a/b/../c/.") == "/a/c");
  CHECK(looplock::lexically_normal("/a//b/./") == "/a/b");
  CHECK(looplock::lexically_normal("/..") == "/");
  CHECK(looplock::lexically_normal("/") == "/");
  CHECK(looplock::lexically_normal("/x/y/z/../../w") == "/x/w");
}
