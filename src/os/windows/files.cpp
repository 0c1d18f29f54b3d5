// files.hpp on Windows, after Microsoft's documentation of each call (wine
// runs tests/unit/test_os.cpp; it enforces none of Windows' byte-range
// locking rules). A directory is a C runtime descriptor of a handle opened
// with FILE_FLAG_BACKUP_SEMANTICS; a file in it is reached by the path the
// system knows the directory by and its name, as a \\?\ path that Windows
// takes as it is (support.hpp's path_in), opened with
// FILE_FLAG_OPEN_REPARSE_POINT, so that a symbolic link is found and
// refused rather than followed. No handle is inheritable. A lock is
// LockFileEx on byte 0, length 1 (what the C runtime's _locking takes, so
// that the loop scripts' own helper and looplock exclude each other); a wait
// for one is a blocking LockFileEx in a thread of its own (lock_until).
// Windows enforces such a lock (wine does not): while it is held, no other
// handle may read or write byte 0, so a locked file's callers keep their
// data elsewhere (records/lockfile.hpp; LockAt::PastData for the incidents
// file).
// clang-format off
#include <windows.h>
#include <fcntl.h>
#include <io.h>
// clang-format on

#include "os/files.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <system_error>
#include <thread>

#include "os/file_status.hpp"
#include "os/sys.hpp"
#include "os/windows/support.hpp"

namespace looplock::sys {

namespace {

using windows::failed;
using windows::path_in;

HANDLE handle_of(int fd) { return reinterpret_cast<HANDLE>(_get_osfhandle(fd)); }

// `fd` at 3 or above: the C runtime gives the lowest free descriptor, which
// is one of stdio's when the caller closed it. _dup makes an inheritable
// handle (DuplicateHandle with bInheritHandle TRUE): it is made not
// inheritable again.
UniqueFd moved_above_stdio(UniqueFd fd) {
  UniqueFd low[3];
  for (int i = 0; fd && fd.get() < 3 && i < 3; ++i) {
    UniqueFd up(_dup(fd.get()));
    if (!up || !SetHandleInformation(handle_of(up.get()), HANDLE_FLAG_INHERIT, 0)) return UniqueFd();
    low[i] = std::move(fd);  // kept open until a descriptor above stdio is found
    fd = std::move(up);
  }
  return fd;
}

// The C runtime's descriptor for `h`, which it then owns.
UniqueFd descriptor_of(HANDLE h, int flags) {
  const int fd = _open_osfhandle(reinterpret_cast<intptr_t>(h), flags | _O_BINARY | _O_NOINHERIT);
  if (fd < 0) {
    CloseHandle(h);
    errno = EMFILE;
  }
  return UniqueFd(fd);
}

// The byte a lock at `at` covers, as LockFileEx takes it.
OVERLAPPED lock_byte(LockAt at) {
  OVERLAPPED o{};
  const unsigned long long offset = locked_range(at).offset;
  o.Offset = static_cast<DWORD>(offset);
  o.OffsetHigh = static_cast<DWORD>(offset >> 32);
  return o;
}

}  // namespace

UniqueFd open_directory(const std::string& path) {
  // READ_CONTROL: its owner is read through this handle (file_status.hpp).
  const std::wstring wide = windows::file_path(path);
  const HANDLE h = CreateFileW(wide.c_str(), FILE_READ_ATTRIBUTES | READ_CONTROL,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                               FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) {
    failed();
    return UniqueFd();
  }
  BY_HANDLE_FILE_INFORMATION info{};
  if (!GetFileInformationByHandle(h, &info) || !(info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) {
    CloseHandle(h);
    errno = ENOTDIR;
    return UniqueFd();
  }
  return moved_above_stdio(descriptor_of(h, _O_RDONLY));
}

UniqueFd open_in(int dirfd, const std::string& name, const OpenIn& how) {
  const auto path = path_in(dirfd, name);
  if (!path) return UniqueFd();
  DWORD access = FILE_READ_ATTRIBUTES | SYNCHRONIZE;
  int flags = 0;
  switch (how.access) {
    case OpenIn::Access::Read:
      access |= GENERIC_READ;
      flags = _O_RDONLY;
      break;
    case OpenIn::Access::Write: flags = _O_WRONLY; break;
    case OpenIn::Access::ReadWrite:
      access |= GENERIC_READ;
      flags = _O_RDWR;
      break;
  }
  if (how.access != OpenIn::Access::Read) {
    // Append only: each write then goes to the end in one step, whoever
    // else appends (with GENERIC_READ for the lock, which LockFileEx needs).
    access |= how.append ? FILE_APPEND_DATA | GENERIC_READ : GENERIC_WRITE;
    if (how.append) flags |= _O_APPEND;
  }
  // Never truncated by the open itself: what is at the name is looked at
  // first (a link is refused untouched), then emptied.
  DWORD disposition = OPEN_EXISTING;
  switch (how.create) {
    case OpenIn::Create::No: disposition = OPEN_EXISTING; break;
    case OpenIn::Create::IfMissing: disposition = OPEN_ALWAYS; break;
    case OpenIn::Create::New: disposition = CREATE_NEW; break;
  }
  // The owner's write bit of `mode` is all Windows keeps of it: a file
  // created without it is read-only.
  const DWORD attributes =
      (how.mode & 0200) || how.create == OpenIn::Create::No ? FILE_ATTRIBUTE_NORMAL : FILE_ATTRIBUTE_READONLY;
  const DWORD share = FILE_SHARE_READ | FILE_SHARE_WRITE | (how.keep_name ? 0 : FILE_SHARE_DELETE);
  const HANDLE h = CreateFileW(path->c_str(), access, share, nullptr, disposition,
                               attributes | FILE_FLAG_OPEN_REPARSE_POINT, nullptr);
  if (h == INVALID_HANDLE_VALUE) {
    failed();
    return UniqueFd();
  }
  // A symbolic link or a junction at the name is never followed; other
  // reparse points (deduplicated or cloud files) are regular files.
  FILE_ATTRIBUTE_TAG_INFO tag{};
  if (!GetFileInformationByHandleEx(h, FileAttributeTagInfo, &tag, sizeof tag)) {
    failed();
    CloseHandle(h);
    return UniqueFd();
  }
  if ((tag.FileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) &&
      (tag.ReparseTag == IO_REPARSE_TAG_SYMLINK || tag.ReparseTag == IO_REPARSE_TAG_MOUNT_POINT)) {
    CloseHandle(h);
    errno = ELOOP;
    return UniqueFd();
  }
  if (how.truncate && !SetEndOfFile(h)) {
    failed();
    CloseHandle(h);
    return UniqueFd();
  }
  UniqueFd fd = descriptor_of(h, flags);
  return how.above_stdio ? moved_above_stdio(std::move(fd)) : std::move(fd);
}

bool may_access(int dirfd, const std::string& name, Permission want) {
  FileStatus st;
  if (!status_at(dirfd, name.c_str(), st)) return false;
  if ((want.write && !(st.mode & 0200)) || (want.search && !st.directory())) {
    errno = EACCES;
    return false;
  }
  return true;
}

bool append_row(int fd, std::string_view row) {
  const HANDLE h = handle_of(fd);
  DWORD n = 0;
  if (h == INVALID_HANDLE_VALUE || row.size() > 0xffffffffu) {
    errno = EBADF;
    return false;
  }
  if (!WriteFile(h, row.data(), static_cast<DWORD>(row.size()), &n, nullptr)) return failed();
  if (n == row.size()) return true;
  DWORD one = 0;
  if (!WriteFile(h, "\n", 1, &one, nullptr)) return failed();
  errno = EIO;
  return false;
}

bool rename_in(int dirfd, const std::string& from, const std::string& to) {
  const auto a = path_in(dirfd, from);
  const auto b = path_in(dirfd, to);
  if (!a || !b) return false;
  // A reader that opened `to` without sharing delete (a metrics scraper, a
  // virus scanner) holds it for a moment: tried again for up to 2 s.
  const Instant give_up = MonotonicClock::now() + std::chrono::seconds(2);
  for (;;) {
    if (MoveFileExW(a->c_str(), b->c_str(), MOVEFILE_REPLACE_EXISTING)) return true;
    const DWORD error = GetLastError();
    const bool busy = error == ERROR_SHARING_VIOLATION || error == ERROR_ACCESS_DENIED || error == ERROR_LOCK_VIOLATION;
    if (!busy || MonotonicClock::now() >= give_up) return failed();
    Sleep(10);
  }
}

bool exchange_in(int, const std::string&, const std::string&) {
  errno = ENOSYS;  // Windows swaps no two names in one step
  return false;
}

std::optional<std::vector<std::string>> names_in(int dirfd, std::string_view prefix) {
  const auto pattern = path_in(dirfd, std::string(prefix) + "*");
  if (!pattern) return std::nullopt;
  WIN32_FIND_DATAW found{};
  const HANDLE h = FindFirstFileW(pattern->c_str(), &found);
  std::vector<std::string> out;
  if (h == INVALID_HANDLE_VALUE) {
    if (GetLastError() == ERROR_FILE_NOT_FOUND) return out;
    failed();
    return std::nullopt;
  }
  do {
    // The pattern matches without regard to case: the prefix must match exactly.
    std::string name = windows::utf8(found.cFileName);
    if (name.starts_with(prefix)) out.push_back(std::move(name));
  } while (FindNextFileW(h, &found));
  FindClose(h);
  return out;
}

bool remove_in(int dirfd, const std::string& name) {
  const auto path = path_in(dirfd, name);
  if (!path) return false;
  return DeleteFileW(path->c_str()) ? true : failed();
}

bool close_checked(UniqueFd fd) { return _close(fd.release()) == 0; }

bool sync_data(int fd) { return _commit(fd) == 0; }

bool reserve_space(int fd, std::size_t size) {
  // The allocation size: the blocks are reserved, the file's size stays (a
  // smaller allocation than the file would cut it: never asked for).
  const long long now = _filelengthi64(fd);
  if (now < 0) return false;
  if (now >= static_cast<long long>(size)) return true;
  FILE_ALLOCATION_INFO info{};
  info.AllocationSize.QuadPart = static_cast<LONGLONG>(size);
  if (SetFileInformationByHandle(handle_of(fd), FileAllocationInfo, &info, sizeof info)) return true;
  if (failed() || errno != ENOSYS) return false;
  // Where that is not implemented (wine), as posix_fallocate(3) does: the
  // file extended with NUL bytes to `size`, which readers skip.
  const errno_t err = _chsize_s(fd, static_cast<long long>(size));
  errno = err;
  return err == 0;
}

bool exclusive_write_lease(int) {
  errno = ENOSYS;  // no lease: the caller replaces the file by a rename instead
  return false;
}

std::optional<std::string> network_file_system(int fd) {
  const auto path = path_of_fd(fd);
  if (!path) return std::nullopt;
  if (path->starts_with("\\\\")) return "smb";  // \\server\share\...
  if (path->size() < 3 || (*path)[1] != ':') return std::nullopt;
  const std::string root = path->substr(0, 3);  // "C:\"
  return GetDriveTypeW(windows::widen(root).c_str()) == DRIVE_REMOTE ? std::optional<std::string>("smb") : std::nullopt;
}

LockedRange locked_range(LockAt at) {
  // Past data: the last byte of the range that offsets of a file's data
  // (signed 64-bit numbers) can reach; Windows lets a lock lie past a file's
  // end.
  return at == LockAt::Start ? LockedRange{.offset = 0, .length = 1}
                             : LockedRange{.offset = 0x7fff'ffff'ffff'fffeULL, .length = 1};
}

bool try_lock(int fd, bool exclusive, LockAt at) {
  OVERLAPPED where = lock_byte(at);
  const DWORD flags = (exclusive ? LOCKFILE_EXCLUSIVE_LOCK : 0) | LOCKFILE_FAIL_IMMEDIATELY;
  if (LockFileEx(handle_of(fd), flags, 0, 1, 0, &where)) return true;
  return failed();  // ERROR_LOCK_VIOLATION: EWOULDBLOCK
}

bool unlock(int fd, LockAt at) {
  OVERLAPPED where = lock_byte(at);
  return UnlockFileEx(handle_of(fd), 0, 1, 0, &where) ? true : failed();
}

namespace {

// A blocking LockFileEx in a thread of its own, on a duplicate of the
// caller's handle (the same file object, so the same lock): the caller waits
// for it with a deadline, and at the deadline leaves it waiting. The thread
// and its handle then live on until looplock exits; a lock granted to them
// after the caller gave up is released at once by the thread itself (`state`
// says which came first). No overlapped wait: one that has to wait never
// completes under wine.
struct BlockingLock {
  enum State { Waiting, Granted, Abandoned };
  std::atomic<int> state{Waiting};
  HANDLE handle = nullptr;
  HANDLE done = nullptr;  // set once LockFileEx has returned
  DWORD flags = 0;
  DWORD error = 0;  // its GetLastError(), 0 when locked
  ~BlockingLock() {
    if (done) CloseHandle(done);
    if (handle) CloseHandle(handle);
  }
};

// Starts the wait; nullptr (errno set) when it cannot be started.
std::shared_ptr<BlockingLock> start_blocking_lock(int fd, bool exclusive) {
  auto wait = std::make_shared<BlockingLock>();
  wait->flags = exclusive ? LOCKFILE_EXCLUSIVE_LOCK : 0;
  if (!DuplicateHandle(GetCurrentProcess(), handle_of(fd), GetCurrentProcess(), &wait->handle, 0, FALSE,
                       DUPLICATE_SAME_ACCESS)) {
    wait->handle = nullptr;
    failed();
    return nullptr;
  }
  if (!(wait->done = CreateEventW(nullptr, TRUE, FALSE, nullptr))) {
    failed();
    return nullptr;
  }
  try {
    std::thread([wait] {
      OVERLAPPED at = lock_byte(LockAt::Start);
      wait->error = LockFileEx(wait->handle, wait->flags, 0, 1, 0, &at) ? 0 : GetLastError();
      int waiting = BlockingLock::Waiting;
      if (wait->error == 0 && !wait->state.compare_exchange_strong(waiting, BlockingLock::Granted)) {
        OVERLAPPED again = lock_byte(LockAt::Start);  // granted too late: nobody holds it on purpose
        UnlockFileEx(wait->handle, 0, 1, 0, &again);
      }
      SetEvent(wait->done);
    }).detach();
  } catch (const std::system_error& e) {
    errno = e.code().value() ? e.code().value() : EAGAIN;
    return nullptr;
  }
  return wait;
}

}  // namespace

LockWait lock_until(int fd, bool exclusive, Deadline deadline, Duration tick, const std::function<void()>& on_tick) {
  if (try_lock(fd, exclusive)) return {LockWait::End::Locked};
  if (errno != EWOULDBLOCK) return {.end = LockWait::End::LockFailed, .failure = {.what = "cannot lock", .err = errno}};
  if (deadline && MonotonicClock::now() >= *deadline) return {LockWait::End::TimedOut};
  const auto wait = start_blocking_lock(fd, exclusive);
  if (!wait) {
    return {.end = LockWait::End::TimerFailed,
            .failure = {.what = "cannot start the lock's wait (a thread for LockFileEx)", .err = errno}};
  }
  Deadline next_tick;
  if (tick > Duration::zero()) next_tick = MonotonicClock::now() + tick;
  for (;;) {
    const Deadline until = earliest(deadline, next_tick);
    DWORD ms = INFINITE;
    if (until) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - MonotonicClock::now()).count();
      ms = static_cast<DWORD>(std::clamp<long long>(left, 0, INFINITE - 1));
    }
    const DWORD r = WaitForSingleObject(wait->done, ms);
    if (r == WAIT_OBJECT_0) {
      if (wait->error == 0) return {LockWait::End::Locked};
      return {.end = LockWait::End::LockFailed,
              .failure = {.what = "cannot lock", .err = windows::errno_of(wait->error)}};
    }
    if (r == WAIT_FAILED) {
      return {.end = LockWait::End::TimerFailed,
              .failure = {.what = "cannot wait for the lock's thread", .err = windows::errno_of(GetLastError())}};
    }
    const Instant now = MonotonicClock::now();
    if (deadline && now >= *deadline) {
      // The thread is left waiting; a lock it was granted meanwhile is taken
      // (granted by the deadline), one granted later it releases itself.
      int waiting = BlockingLock::Waiting;
      if (wait->state.compare_exchange_strong(waiting, BlockingLock::Abandoned)) return {LockWait::End::TimedOut};
      WaitForSingleObject(wait->done, INFINITE);  // granted: the thread is about to say so
      return {LockWait::End::Locked};
    }
    if (next_tick && now >= *next_tick) {
      on_tick();
      next_tick = now + tick;
    }
  }
}

}  // namespace looplock::sys
