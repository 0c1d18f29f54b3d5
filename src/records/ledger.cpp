#include "records/ledger.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/sealed.hpp"

namespace looplock {

namespace {

// kMaxLedgerEntries entries of the longest names fit (each about 2 KB).
constexpr size_t kMaxLedgerBytes = 4 << 20;

// Reserves the blocks of `size` bytes of `fd` beyond its end without
// changing its size (FALLOC_FL_KEEP_SIZE), so that a crash before the write
// leaves the ledger as it was; where the file system cannot, by
// posix_fallocate(3), whose NUL bytes past the end readers skip. 0 or errno.
int reserve(int fd, size_t size) {
  if (sys::retry_eintr([&] { return fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)); }) == 0) return 0;
  if (errno != EOPNOTSUPP && errno != ENOSYS) return errno;
  int err;
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (err == EINTR);
  return err;
}

std::string ledger_display(const LockDir& dir) {
  return dir.path + (dir.path.ends_with('/') ? "" : "/") + kRunsName;
}

}  // namespace

std::optional<Refusal> refuse_ledger(const sys::FileStatus& file, const sys::FileStatus& dir, Uid euid,
                                     std::string_view shown_dir) {
  return refuse_file(file, dir, euid, "run ledger", kRunsName, "unsafe_run_ledger", shown_dir);
}

LedgerRead read_ledger(const LockDir& dir) {
  LedgerRead out;
  sys::FileStatus st;
  if (!sys::status_at(dir.fd.get(), kRunsName, st)) {
    if (errno == ENOENT) return out;
    fail_errno(status_for_errno(errno, exit_code::kCantCreate), "cannot stat " + ledger_display(dir), errno, "",
               "run_ledger_unusable");
  }
  if (auto r = refuse_ledger(st, dir.st, sys::own_euid(), dir.path)) {
    throw Fatal(exit_code::kCantCreate, "unsafe run ledger " + ledger_display(dir) + ": " + r->why, r->hint, r->event);
  }
  UniqueFd fd(sys::retry_eintr(
      [&] { return openat(dir.fd.get(), kRunsName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  if (!fd) {
    const int err = errno;
    fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot open " + ledger_display(dir), err,
               err == EACCES ? "--once-per reads it under the lock: its owner (uid " + std::to_string(st.owner) +
                                   ") or root lets the group that shares DIR read and write it (chgrp GROUP " +
                                   ledger_display(dir) + "; chmod g+rw " + ledger_display(dir) + ")."
                             : "",
               "run_ledger_unusable");
  }
  // Rewritten in place under the lock: a read without it that overlapped a
  // write fails its check, and is taken again.
  std::optional<std::string> text;
  std::optional<Unsealed> object;
  for (int attempt = 0; attempt < 5 && !(object && object->checked); ++attempt) {
    if (attempt > 0) sys::sleep_until_ns(sys::monotonic_ns() + 2'000'000);
    text = sys::pread_all(fd.get(), kMaxLedgerBytes);
    if (!text) fail_errno(exit_code::kOsError, "cannot read " + ledger_display(dir), errno, "", "run_ledger_unusable");
    // NUL bytes past the newline: blocks reserved for a rewrite that never
    // came (a crash), where the file system could not keep the size.
    while (!text->empty() && text->back() == '\0') text->pop_back();
    if (text->empty()) return out;
    object = unseal(*text);
  }
  const Json j = object && object->checked ? Json::parse(object->object.begin(), object->object.end(), nullptr, false)
                                           : Json(nullptr);
  if (!j.is_object() || j.value("schema", std::string()) != kRunsSchema || !j.contains("runs") ||
      !j["runs"].is_array()) {
    out.unreadable = true;
    return out;
  }
  for (const auto& item : j["runs"]) {
    if (auto e = run_entry_from_json(item)) {
      out.entries.push_back(std::move(*e));
    } else {
      out.damaged.push_back(item.is_object() && item.contains("operation") && item["operation"].is_string()
                                ? item["operation"].get<std::string>()
                                : "?");
    }
  }
  return out;
}

std::optional<RunEntry> entry_of(const LedgerRead& ledger, const std::string& operation) {
  for (auto it = ledger.entries.rbegin(); it != ledger.entries.rend(); ++it) {
    if (it->operation == operation) return *it;
  }
  return std::nullopt;
}

LedgerLook look_local_ledger(const LockDir& dir, const std::string& operation) {
  const LedgerRead read = read_ledger(dir);
  LedgerLook look;
  look.entry = entry_of(read, operation);
  look.whole = read.unreadable;
  look.damaged = read.unreadable ||
                 std::find(read.damaged.begin(), read.damaged.end(), operation) != read.damaged.end() ||
                 (!look.entry && std::find(read.damaged.begin(), read.damaged.end(), "?") != read.damaged.end());
  return look;
}

LedgerUpdate record_local_ledger(const LockDir& dir, const RunEntry& entry, long long now_ms) {
  const LedgerRead read = read_ledger(dir);
  LedgerUpdate u = with_entry(read.entries, entry, now_ms);
  if (const int err = write_ledger(dir, u.entries); err != 0) {
    const std::string path = ledger_display(dir);
    const std::string why =
        err == ENOSPC ? "The file system is full; the ledger was left as it was. "
        : err == EPERM || err == EACCES
            ? "You may neither write it nor replace it (in a sticky DIR only its owner may): its owner or root lets "
              "the group write it (chmod g+rw " + path + "), or DIR's owner makes it once for the group (install -m "
              "0660 -g GROUP /dev/null " + path + "). "
            : "";
    fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot write the run ledger " + path, err,
               why + "--once-per records each run there before the command starts; the command did not run.",
               "run_ledger_unusable");
  }
  return u;
}

int write_ledger(const LockDir& dir, const std::vector<RunEntry>& entries) {
  const std::string data = encode_ledger(entries);
  // In place when this process may write the file (no journal transaction:
  // sealed.hpp); a torn write fails its check, so it reads as no entry.
  UniqueFd in_place(sys::retry_eintr(
      [&] { return openat(dir.fd.get(), kRunsName, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  if (in_place) {
    sys::FileStatus st;
    if (!sys::status_of_fd(in_place.get(), st)) return errno;
    if (refuse_ledger(st, dir.st, sys::own_euid())) return EPERM;
    // Its new length first: a full disk then fails here, before a byte of
    // the ledger changed (a torn ledger would lose every operation's slot).
    if (static_cast<size_t>(st.size) < data.size()) {
      if (const int err = reserve(in_place.get(), data.size()); err != 0) return err;
    }
    return write_over(in_place.get(), data, static_cast<long long>(kMaxLedgerBytes)) ? 0 : errno;
  }
  if (errno != ENOENT && errno != EACCES && errno != EPERM) return errno;
  // Missing, or a group member's file this process may not write: a new
  // file beside it, renamed over it. Only the lock's holder writes the
  // ledger, so one name for the new file serves; one left by a looplock that
  // died mid-write is replaced.
  const auto create = [&] {
    return sys::retry_eintr([&] {
      return openat(dir.fd.get(), kRunsNewName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY,
                    kCreateMode);
    });
  };
  UniqueFd fd(create());
  if (!fd && errno == EEXIST) {
    (void)unlinkat(dir.fd.get(), kRunsNewName, 0);
    fd.reset(create());
  }
  if (!fd) return errno;
  int err = sys::write_all(fd.get(), data) ? 0 : errno;
  if (err == 0 && ::close(fd.release()) != 0) err = errno;
  if (err == 0 && renameat(dir.fd.get(), kRunsNewName, dir.fd.get(), kRunsName) != 0) err = errno;
  if (err != 0) (void)unlinkat(dir.fd.get(), kRunsNewName, 0);
  return err;
}

}  // namespace looplock
