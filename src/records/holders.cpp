#include "records/holders.hpp"

#include <algorithm>
#include <charconv>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "os/file_status.hpp"
#include "os/file_watch.hpp"
#include "os/files.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

LockedFileRole index_role(int index) {
  return {.name = index_name(index),
          .noun = "holder index",
          .event = "unsafe_holder_index",
          .fix_names = std::string(kHoldersPrefix) + "*"};
}

}  // namespace

std::optional<bool> index_intact(const LockDir& dir, int index, const LockFile& f) {
  sys::FileStatus now;
  if (!sys::status_at(dir.fd.get(), index_name(index).c_str(), now)) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return std::nullopt;
  }
  return sys::same_file(now, f.st);
}

std::string index_name(int index) { return std::string(kHoldersPrefix) + std::to_string(index); }

std::optional<int> index_of_name(std::string_view name) {
  if (!name.starts_with(kHoldersPrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kHoldersPrefix.size());
  if (digits.empty() || digits.size() > 7 || (digits.size() > 1 && digits[0] == '0') ||
      digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  int v = 0;
  const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || p != digits.data() + digits.size()) return std::nullopt;
  return v;
}

IndexWait take_index(const LockDir& dir, int n, const WaitPlan& plan, Instant start,
                     const std::function<void()>& on_wait, const std::function<void()>& on_poll) {
  const bool bounded = plan.kind == WaitPlan::Kind::Bounded;
  const Instant deadline = later(start, plan.timeout);
  // Each index file is opened when the search reaches it (a free lock
  // opens index 0 alone), and stays open for the whole wait: a waiter never
  // closes one it may write, so waiters never wake each other
  // (file_watch.hpp).
  std::vector<LockFile> files(static_cast<size_t>(n));
  auto open_index = [&](int k) {
    try {
      files[k] = open_lock_file(dir, index_role(k));
    } catch (const Fatal& f) {
      if (f.status() != exit_code::kOsError) throw;
      throw Fatal(f.status(), f.what(),
                  "--holders " + std::to_string(n) +
                      " keeps its index files open while it waits for a free one: "
                      "raise the open-file limit (ulimit -n) above " +
                      std::to_string(n + 32) + ", or give a smaller N.",
                  f.event());
    }
  };
  std::optional<sys::CloseWatch> watch;
  int replaced = 0;
  for (;;) {
    for (int k = 0; k < n; ++k) {
      if (!files[k].fd) open_index(k);
      if (!sys::try_lock(files[k].fd.get(), /*exclusive=*/true)) {
        if (errno == EWOULDBLOCK || errno == EAGAIN || errno == EACCES) continue;
        fail_errno(exit_code::kOsError, "cannot lock " + sys::path_in_dir(dir.path, index_name(k)), errno);
      }
      const auto intact = index_intact(dir, k, files[k]);
      if (!intact) {
        fail_errno(exit_code::kOsError,
                   "cannot check that " + sys::path_in_dir(dir.path, index_name(k)) + " is still the file locked",
                   errno, "The command was not run.");
      }
      if (*intact) {
        IndexWait w;
        w.status = Acquisition::Acquired;
        w.index = k;
        w.file = std::move(files[k]);
        return w;
      }
      // Deleted or replaced meanwhile: the lock on the old inode protects
      // nothing; the new file is taken instead.
      if (++replaced >= 1000) {
        throw Fatal(exit_code::kCantCreate,
                    "cannot lock " + sys::path_in_dir(dir.path, index_name(k)) + ": it keeps being replaced",
                    "Something deletes or recreates the holder index files in a loop; never delete them.");
      }
      open_index(k);
      --k;  // the same index again
    }
    const Instant now = MonotonicClock::now();
    if (plan.kind == WaitPlan::Kind::NoWait || (bounded && now >= deadline)) {
      IndexWait w;
      w.status = plan.kind == WaitPlan::Kind::NoWait ? Acquisition::Busy : Acquisition::TimedOut;
      w.held = std::move(files);
      return w;
    }
    if (!watch) {
      std::vector<std::string> names;
      for (int k = 0; k < n; ++k) names.push_back(index_name(k));
      watch.emplace(dir.fd.get(), names, /*absorb_alarm=*/bounded);
      on_wait();  // once SIGALRM is absorbed: a wait said is a wait it survives
    }
    watch->wait(bounded ? std::min(kIndexPoll, deadline - now) : kIndexPoll);
    if (on_poll) on_poll();
  }
}

std::vector<int> indexes_in(const LockDir& dir) {
  std::vector<int> out;
  for (const auto& name : sys::names_in(dir.fd.get(), kHoldersPrefix).value_or(std::vector<std::string>{})) {
    if (const auto k = index_of_name(name)) out.push_back(*k);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<LockFile> open_index_to_read(const LockDir& dir, int index) {
  const std::string name = index_name(index);
  sys::FileStatus before;
  if (!sys::status_at(dir.fd.get(), name.c_str(), before) || !before.regular()) return std::nullopt;
  LockFile file;
  file.fd = sys::open_in(dir.fd.get(), name, {.access = sys::OpenIn::Access::Read, .above_stdio = true});
  if (!file.fd || !sys::status_of_fd(file.fd.get(), file.st) || !file.st.regular()) return std::nullopt;
  return file;
}

}  // namespace looplock
