#include "records/ledger.hpp"

#include <algorithm>
#include <charconv>
#include <cerrno>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/clock.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/sealed.hpp"

namespace looplock {

namespace {

// kMaxLedgerEntries entries of the longest names fit (each about 2 KB);
// the file holds a few copies (two kept, the new one, and the gaps that
// copies of changing lengths leave): past kMaxFileBytes, where readers stop,
// none goes, and the file is replaced.
constexpr size_t kMaxLedgerBytes = 4 << 20;
constexpr size_t kMaxFileBytes = 3 * kMaxLedgerBytes + 3;

std::string ledger_display(const LockDir& dir) { return sys::path_in_dir(dir.path, kRunsName); }

// The ledger's newest valid copy in a file's text: of the copies that unseal
// with their check and are a ledger (its schema, an array of runs), the one
// of the highest generation (none: an earlier version's single copy, 0).
struct Newest {
  Json json;
  unsigned long long generation = 0;
  size_t begin = 0;
  size_t end = 0;
};
std::optional<Newest> as_ledger(const SealedCopy& c) {
  Json j = Json::parse(c.object.begin(), c.object.end(), nullptr, false);
  if (!j.is_object() || j.value("schema", std::string()) != kRunsSchema || !j.contains("runs") ||
      !j["runs"].is_array()) {
    return std::nullopt;
  }
  const auto g =
      j.contains("generation") && j["generation"].is_number_unsigned() ? j["generation"].get<unsigned long long>() : 0ULL;
  return Newest{.json = std::move(j), .generation = g, .begin = c.begin, .end = c.end};
}

// A line's generation as encode_ledger starts a copy, read without checking
// or parsing it; nullopt for a line that does not start so.
std::optional<unsigned long long> peek_generation(std::string_view line) {
  const size_t at = line.find_first_not_of(std::string_view("\0 ", 2));
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at);
  // No string built: a ledger is peeked line by line, four times a run.
  for (const std::string_view part : {std::string_view("{\"schema\":\""), std::string_view(kRunsSchema),
                                      std::string_view("\",\"generation\":")}) {
    if (!rest.starts_with(part)) return std::nullopt;
    rest.remove_prefix(part.size());
  }
  unsigned long long g = 0;
  const char* first = rest.data();
  const auto [end, ec] = std::from_chars(first, line.data() + line.size(), g);
  if (ec != std::errc() || end == first) return std::nullopt;
  return g;
}

// Whether `span` of `text` is still a whole line that is a valid copy.
bool whole_copy_at(std::string_view text, Span span) {
  if (span.end > text.size() || span.begin >= span.end || (span.begin > 0 && text[span.begin - 1] != '\n') ||
      text[span.end - 1] != '\n' || text.substr(span.begin, span.end - span.begin - 1).find('\n') != std::string_view::npos) {
    return false;
  }
  return sealed_copy_at(text, span).has_value();
}

std::optional<Newest> newest_copy(std::string_view text) {
  // The lines in the order of the generation they start with, newest
  // first: the first that is a whole ledger of that generation is the
  // newest, and older lines are not checked at all (each check is a
  // SHA-256 and a parse, and a ledger is read four times a run).
  std::vector<std::pair<unsigned long long, Span>> peeked;
  for (const Span& line : line_spans(text)) {
    if (const auto g = peek_generation(text.substr(line.begin, line.end - line.begin))) peeked.push_back({*g, line});
  }
  // Of equals, the last in the file (as below).
  std::stable_sort(peeked.begin(), peeked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second.begin > b.second.begin;
  });
  for (const auto& [g, line] : peeked) {
    if (const auto c = sealed_copy_at(text, line)) {
      if (auto n = as_ledger(*c); n && n->generation == g) return n;
      break;  // a whole copy that does not say what it starts with: read them all
    }
  }
  // Else every copy, the one of the highest generation (the last in the
  // file of equals): copies of an earlier version, or of another order.
  std::optional<Newest> best;
  for (const SealedCopy& c : sealed_copies(text)) {
    if (auto n = as_ledger(c); n && (!best || n->generation >= best->generation)) best = std::move(n);
  }
  return best;
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
  const UniqueFd fd = sys::open_in(dir.fd.get(), kRunsName, {.access = sys::OpenIn::Access::Read});
  if (!fd) {
    const int err = errno;
    fail_errno(status_for_errno(err, exit_code::kCantCreate), "cannot open " + ledger_display(dir), err,
               err == EACCES ? "--once-per reads it under the lock: its owner (uid " + std::to_string(st.owner) +
                                   ") or root lets the group that shares DIR read and write it (chgrp GROUP " +
                                   ledger_display(dir) + "; chmod g+rw " + ledger_display(dir) + ")."
                             : "",
               "run_ledger_unusable");
  }
  // Written beside its newest copy under the lock (ledger.hpp): a read
  // without it that found no whole copy overlapped two writes, and is taken
  // again.
  std::optional<Newest> newest;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) sleep_until(MonotonicClock::now() + std::chrono::milliseconds(2));
    const auto text = sys::pread_all(fd.get(), kMaxFileBytes);
    if (!text) fail_errno(exit_code::kOsError, "cannot read " + ledger_display(dir), errno, "", "run_ledger_unusable");
    if (text->find_first_not_of(std::string_view("\0 \n", 3)) == std::string::npos) return out;  // nothing written yet
    newest = newest_copy(*text);
    if (newest) break;
  }
  if (!newest) {
    out.unreadable = true;
    return out;
  }
  out.generation = newest->generation;
  for (const auto& item : newest->json["runs"]) {
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

UniqueFd guard_ledger(const LockDir& dir) {
  // Made empty when missing (an empty ledger reads as no entry), so that
  // there is always a file to lock: else the first writers would each make
  // it by a rename, unguarded, and lose each other's entries.
  UniqueFd guard = sys::open_in(dir.fd.get(), kRunsName,
                                {.access = sys::OpenIn::Access::Read,
                                 .create = sys::OpenIn::Create::IfMissing,
                                 .mode = kCreateMode});
  if (!guard) guard = sys::open_in(dir.fd.get(), kRunsName, {.access = sys::OpenIn::Access::Read});
  if (!guard) return guard;
  const Instant until = MonotonicClock::now() + std::chrono::seconds(5);
  while (!sys::try_lock(guard.get(), /*exclusive=*/true, sys::LockAt::PastData)) {
    if (MonotonicClock::now() >= until) return UniqueFd();
    nap(std::chrono::milliseconds(2));
  }
  return guard;
}

LedgerUpdate record_local_ledger(const LockDir& dir, const RunEntry& entry, long long now_ms, OwnCopies& own) {
  const LedgerRead read = read_ledger(dir);
  LedgerUpdate u = with_entry(read.entries, entry, now_ms);
  if (const auto f = write_ledger(dir, u.entries, own)) {
    fail(status_for_errno(f->err, exit_code::kCantCreate),
         {.what = "cannot write the run ledger " + ledger_display(dir) + " (" + f->what + ")",
          .err = f->err,
          .hint = f->hint + "--once-per records each run there before the command starts; the command did not run."},
         "run_ledger_unusable");
  }
  return u;
}

namespace {

// The fix for a ledger write that failed with `err`, where it has one.
std::string ledger_fix(const LockDir& dir, int err, bool existed) {
  const std::string path = ledger_display(dir);
  if (err == ENOSPC) return "The file system is full; the ledger was left as it was. ";
  if (err == EROFS) return "DIR's file system is read-only; remount it read-write. ";
  if (err != EPERM && err != EACCES) return "";
  if (!sys::abilities().permission_bits) {  // Windows: access is by ACL, and a mode says nothing of it
    return existed ? "You may not write it: its owner or an administrator lets you (icacls " + shell_word(path) +
                         " /grant %USERNAME%:M). "
                   : "You may not create files in DIR (" + dir.path +
                         "), or its volume is read-only: DIR's owner or an administrator lets you (icacls " +
                         shell_word(dir.path) + " /grant %USERNAME%:M). ";
  }
  if (!existed && dir.st.owner == sys::own_euid()) {
    return "You may not create files in DIR (" + dir.path + ", mode " + octal_mode(dir.st.mode) +
           "), which is yours: make it writable (chmod u+w " + shell_word(dir.path) + "). ";
  }
  if (!existed) {
    return "You may not create files in DIR (" + dir.path + ", mode " + octal_mode(dir.st.mode) + ", uid " +
           std::to_string(dir.st.owner) +
           "): its owner or root makes it writable for you, or makes the ledger once "
           "(install -m 0660 -g GROUP /dev/null " +
           path + " for a group). ";
  }
  return "You may neither write it nor replace it (in a sticky DIR only its owner may): its owner or root lets "
         "the group write it (chmod g+rw " +
         path +
         "), or DIR's owner makes it once for the group (install -m "
         "0660 -g GROUP /dev/null " +
         path + "). ";
}

// The step that failed; errno is read first, before any string is made.
sys::Failure failure(const LockDir& dir, const char* step, const char* name, bool existed) {
  const int err = errno;
  return sys::Failure{.what = std::string(step) + name, .err = err, .hint = ledger_fix(dir, err, existed)};
}

// The write in place (write_ledger's): done, failed, or (`replace`) not
// done because the file's copies leave no room for a new one where readers
// look (a file spread out by an earlier version's padding).
struct InPlace {
  std::optional<sys::Failure> failure;
  bool replace = false;
};
InPlace write_in_place(const LockDir& dir, int fd, const std::vector<RunEntry>& entries, OwnCopies& own) {
  sys::FileStatus st;
  if (!sys::status_of_fd(fd, st)) return {failure(dir, "fstat", "", true)};
  if (auto r = refuse_ledger(st, dir.st, sys::own_euid(), dir.path)) {
    return {sys::Failure{.what = "it became unsafe: " + r->why, .hint = r->hint + " "}};
  }
  const auto text = sys::pread_all(fd, kMaxFileBytes);
  if (!text) return {failure(dir, "reading it", "", true)};
  const auto newest = newest_copy(*text);
  const OwnCopies before = own;
  own = {};  // known again only once this write is whole
  if (!newest) {  // nothing to keep: one copy at the start, over whatever is there (what follows is no copy)
    const std::string data = encode_ledger(entries, 0);
    if (static_cast<size_t>(st.size) < data.size() && !sys::reserve_space(fd, data.size())) {
      return {failure(dir, "reserving its new length", "", true)};
    }
    if (!sys::pwrite_all(fd, data, 0)) return {failure(dir, "writing it", "", true)};
    return {};
  }
  const std::string data = encode_ledger(entries, newest->generation + 1);
  const Span kept{newest->begin, newest->end};
  // Right after this looplock's own write (one since its last sync), the
  // copy that was durable before it is kept too, and nothing waits for the
  // disk, when that copy is still whole where it was (a nested run's write
  // cut short may have gone over it). Else (or when the two leave no room)
  // the newest copy is made durable first, and kept.
  Span durable = before.durable;
  std::optional<Placement> p;
  if (before.known && !before.unsynced && before.generation == newest->generation &&
      before.written.begin == kept.begin && before.written.end == kept.end && whole_copy_at(*text, durable)) {
    p = place_copy(data, {durable, kept}, kMaxFileBytes);
  }
  const bool unsynced = p.has_value();
  if (!p) {
    if (!sys::sync_data(fd)) return {failure(dir, "syncing it", "", true)};
    durable = kept;
    p = place_copy(data, {kept}, kMaxFileBytes);
  }
  if (!p) return {std::nullopt, true};
  // Its new length first: a full disk then fails before a byte changed.
  // Where the file system reserves with NUL bytes past the end, readers
  // skip them.
  const auto end = static_cast<size_t>(p->offset) + p->data.size();
  if (static_cast<size_t>(st.size) < end && !sys::reserve_space(fd, end)) {
    return {failure(dir, "reserving its new length", "", true)};
  }
  if (!sys::pwrite_all(fd, p->data, p->offset)) return {failure(dir, "writing it", "", true)};
  own = {.known = true,
         .unsynced = unsynced,
         .generation = newest->generation + 1,
         .written = {static_cast<size_t>(p->offset), end},
         .durable = durable};
  return {};
}

// A new file beside the ledger, renamed over it. Only the lock's holder
// writes the ledger, so one name for the new file serves; one left by a
// looplock that died mid-write is replaced.
std::optional<sys::Failure> replace_ledger(const LockDir& dir, const std::vector<RunEntry>& entries, bool existed) {
  const sys::OpenIn create{
      .access = sys::OpenIn::Access::Write, .create = sys::OpenIn::Create::New, .mode = kCreateMode};
  UniqueFd fd = sys::open_in(dir.fd.get(), kRunsNewName, create);
  if (!fd && errno == EEXIST) {
    (void)sys::remove_in(dir.fd.get(), kRunsNewName);
    fd = sys::open_in(dir.fd.get(), kRunsNewName, create);
  }
  if (!fd) return failure(dir, "creating ", kRunsNewName, existed);
  const std::string data = encode_ledger(entries, 0);
  std::optional<sys::Failure> f;
  if (!sys::write_all(fd.get(), data)) f = failure(dir, "writing ", kRunsNewName, existed);
  // On disk before it replaces a ledger that was: else a power cut could
  // leave the name on an empty file (the rename's order is the file
  // system's), and every entry lost.
  if (!f && existed && !sys::sync_data(fd.get())) f = failure(dir, "syncing ", kRunsNewName, existed);
  if (!f && !sys::close_checked(std::move(fd))) f = failure(dir, "writing ", kRunsNewName, existed);
  if (!f && !sys::rename_in(dir.fd.get(), kRunsNewName, kRunsName)) {
    f = failure(dir, "renaming ", kRunsNewName, existed);
  }
  if (f) (void)sys::remove_in(dir.fd.get(), kRunsNewName);
  return f;
}

}  // namespace

std::optional<sys::Failure> write_ledger(const LockDir& dir, const std::vector<RunEntry>& entries, OwnCopies& own) {
  // In place when this process may write the file: the new copy goes
  // where it overlaps none of the copies kept (sealed.hpp), so a write cut
  // short for any reason (a full disk, RLIMIT_FSIZE, a quota, EIO, a
  // crash) leaves them, and every operation's entry in them, as they were.
  UniqueFd in_place = sys::open_in(dir.fd.get(), kRunsName, {.access = sys::OpenIn::Access::ReadWrite});
  if (in_place) {
    const InPlace done = write_in_place(dir, in_place.get(), entries, own);
    if (!done.replace) return done.failure;
    in_place.reset();  // not open while it is replaced (Windows)
    return replace_ledger(dir, entries, true);
  }
  if (errno != ENOENT && errno != EACCES && errno != EPERM) return failure(dir, "opening it", "", true);
  // Missing, or a group member's file this process may not write.
  own = {};  // another file then: the next write makes its copy durable first
  return replace_ledger(dir, entries, errno != ENOENT);
}

}  // namespace looplock
