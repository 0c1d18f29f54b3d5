// Where looplock keeps its data around a lock, on every system (this file
// runs on Linux and under wine, tests/unit/meson.build): no byte that a lock
// covers is ever read or written through another handle. Windows enforces
// its byte-range locks (a lock denies its bytes to every other handle, even
// of the same process), which wine does not, so the layout is checked here
// from what the system says its locks cover (os/files.hpp's locked_range):
// looplock-windows(7) names the layout.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "os/files.hpp"
#include "os/sys.hpp"
#include "records/holder.hpp"
#include "records/incident.hpp"
#include "records/lockfile.hpp"

using namespace looplock;

namespace {

// Whether a lock on `range` leaves the bytes [0, size) that readers read
// free: an advisory lock (length 0 here: the whole file, denying nothing)
// always does.
bool leaves_data_free(sys::LockedRange range, unsigned long long size, bool advisory) {
  if (advisory) return true;
  return range.offset >= size;
}

}  // namespace

TEST_CASE("no locked byte is read or written through another handle") {
  const auto base = std::filesystem::temp_directory_path() / ("looplock-test-layout-" + std::to_string(sys::own_pid()));
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  const bool advisory = sys::abilities().advisory_locks;
  {
    LockDir dir = open_lock_dir(reinterpret_cast<const char*>(base.u8string().c_str()));  // looplock's paths are UTF-8
    LockFile file = open_lock_file(dir);
    REQUIRE(sys::try_lock(file.fd.get(), true, sys::LockAt::Start));

    // The holder record: written by the holder, read by anyone through a
    // handle of their own.
    HolderRecord r{.lock_id = "0123456789abcdef",
                   .pid = 1,
                   .pid_start = "2",
                   .agent_id = "a",
                   .operation = "o",
                   .policy = "mutation",
                   .acquired_at = "2026-12-04T00:00:00.000Z",
                   .released_at = std::nullopt,
                   .hold = std::nullopt};
    REQUIRE(write_holder(record_fd(file), r));
    const UniqueFd reader = sys::open_in(dir.fd.get(), record_name(), {.access = sys::OpenIn::Access::Read});
    REQUIRE(reader);
    CHECK(read_holder(reader.get()).state == HolderRead::State::Valid);
    sys::FileStatus lock_st;
    REQUIRE(sys::status_of_fd(file.fd.get(), lock_st));
    // The lock file's bytes, which readers of a record in it read.
    CHECK(leaves_data_free(sys::locked_range(sys::LockAt::Start), static_cast<unsigned long long>(lock_st.size),
                           advisory));
    if (advisory) {
      CHECK(std::string(record_name()) == kLockName);  // one file says who holds its lock
      CHECK(lock_st.size > 0);
    } else {
      CHECK(std::string(record_name()) == kHolderName);
      CHECK(record_fd(file) != file.fd.get());
      CHECK(lock_st.size == 0);  // the lock file holds no data
    }

    // The incidents file: appenders lock it for a moment; readers read all
    // of it meanwhile (--inspect --incidents), up to any size it may have.
    CHECK(leaves_data_free(sys::locked_range(sys::LockAt::PastData), 1ULL << 62, advisory));
    CHECK(append_incident(dir.fd.get(), "{\"x\":1}\n") == 0);
    const UniqueFd rows = sys::open_in(dir.fd.get(), kIncidentsName, {.access = sys::OpenIn::Access::Read});
    REQUIRE(rows);
    CHECK(sys::pread_all(rows.get(), 100, 0) == "{\"x\":1}\n");
  }
  std::filesystem::remove_all(base);
}

TEST_CASE("the check above finds a lock on the bytes a reader reads") {
  CHECK_FALSE(leaves_data_free({.offset = 0, .length = 1}, 10, false));
  CHECK(leaves_data_free({.offset = 0, .length = 1}, 0, false));
  CHECK(leaves_data_free({.offset = 0, .length = 1}, 10, true));
}
