#include "records/incident.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <deque>
#include <iterator>

#include "base/log.hpp"
#include "os/file_status.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/lockfile.hpp"

namespace looplock {

Json incident_to_json(const Incident& i) {
  Json j = Json::object();
  j["schema"] = kIncidentSchema;
  j["at"] = i.at;
  j["error_code"] = i.error_code;
  j["lock_id"] = i.lock_id;
  j["policy"] = i.policy;
  j["deadline_ms"] = i.deadline_ms;
  j["waited_ms"] = i.waited_ms;
  j["holder"] = i.holder ? holder_to_json(*i.holder) : Json(nullptr);
  j["holder_alive"] = i.holder_alive ? Json(*i.holder_alive) : Json(nullptr);
  j["holder_pids"] = i.holder_pids;
  if (!i.record_status.empty()) j["record_status"] = i.record_status;
  if (i.record) j["record"] = holder_to_json(*i.record);
  if (!i.warnings.empty()) j["warnings"] = i.warnings;
  j["waiter"] = {
      {"pid", i.waiter_pid}, {"agent_id", clip_bytes(i.waiter_agent)}, {"operation", clip_bytes(i.waiter_operation)}};
  if (i.fields.is_object()) j.update(i.fields);
  if (i.details.is_object()) {
    for (auto it = i.details.begin(); it != i.details.end(); ++it) j[it.key()] = it.value();
  }
  j["operator_action"] = i.operator_action;
  return j;
}

std::string encode_incident(const Incident& i) { return dump_json(incident_to_json(i)) + "\n"; }

std::optional<Json> parse_incident_line(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (line.empty() || line.front() != '{' || line.back() != '}') return std::nullopt;
  auto j = Json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string(); };
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number_integer(); };
  if (!str("schema") || j["schema"] != kIncidentSchema) return std::nullopt;
  if (!str("at") || !str("error_code") || !str("lock_id") || !str("policy") || !str("operator_action"))
    return std::nullopt;
  if (!num("deadline_ms") || !num("waited_ms")) return std::nullopt;
  if (!j.contains("holder") || !(j["holder"].is_null() || holder_from_json(j["holder"]))) return std::nullopt;
  if (!j.contains("holder_alive") || !(j["holder_alive"].is_null() || j["holder_alive"].is_boolean()))
    return std::nullopt;
  if (!j.contains("holder_pids") || !j["holder_pids"].is_array()) return std::nullopt;
  for (const auto& p : j["holder_pids"])
    if (!p.is_number_integer()) return std::nullopt;
  if (!j.contains("waiter") || !j["waiter"].is_object()) return std::nullopt;
  const auto& w = j["waiter"];
  if (!w.contains("pid") || !w["pid"].is_number_integer() || !w.contains("agent_id") || !w["agent_id"].is_string() ||
      !w.contains("operation") || !w["operation"].is_string())
    return std::nullopt;
  return j;
}

int append_incident(int dirfd, const std::string& line) {
  UniqueFd fd(sys::retry_eintr([&] {
    return openat(dirfd, kIncidentsName, O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                  kCreateMode);
  }));
  if (!fd) return errno;
  sys::FileStatus st;
  if (!sys::status_of_fd(fd.get(), st)) return errno;
  if (!S_ISREG(st.mode)) return EINVAL;
  if (st.links != 1) return EMLINK;
  // A row cut short earlier (a full disk, a file-size limit) ends without a
  // newline: this one then starts on a line of its own instead of being
  // glued to it (readers count the damaged line and skip it). Appenders
  // take a flock(2) on the incidents file (not the lock they wait for) for
  // the look and the write, so that none takes another's row, half written
  // across a page, for a damaged one; briefly: past 100 ms it appends
  // without looking.
  bool locked = false;
  for (int i = 0; i < 100 && !(locked = flock(fd.get(), LOCK_EX | LOCK_NB) == 0); ++i) {
    sys::nap_ns(1'000'000);
  }
  char last = '\n';
  const bool cut = locked && sys::status_of_fd(fd.get(), st) && st.size > 0 &&
                   pread(fd.get(), &last, 1, st.size - 1) == 1 && last != '\n';
  std::string row(cut ? 1 : 0, '\n');
  row += line;
  ssize_t n = sys::retry_eintr([&] { return write(fd.get(), row.data(), row.size()); });
  if (n < 0) return errno;
  if (static_cast<size_t>(n) != row.size()) {
    // Cut short: end the damaged line now if the file takes one more byte;
    // when it does not, that write says why (a full disk, a size limit).
    if (sys::retry_eintr([&] { return write(fd.get(), "\n", 1); }) < 0) return errno;
    return EIO;
  }
  return 0;
}

namespace {

// Where a row lies in the file.
struct Span {
  off_t at = 0;
  size_t size = 0;
};
constexpr size_t kMaxRowBytes = 1 << 20;  // a longer line is a runaway: malformed, never read

}  // namespace

IncidentSummary summarize_incidents(int dirfd, size_t recent) {
  IncidentSummary s;
  UniqueFd fd(sys::retry_eintr(
      [&] { return openat(dirfd, kIncidentsName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); }));
  if (!fd) {
    if (errno != ENOENT) s.error = errno;  // a symlink (ELOOP), a permission
    return s;
  }
  sys::FileStatus st;
  if (!sys::status_of_fd(fd.get(), st)) {
    s.error = errno;
    return s;
  }
  if (!S_ISREG(st.mode)) {
    s.error = EINVAL;  // lock_files.hpp says what it is instead
    return s;
  }
  s.exists = true;
  // One pass: count the rows, and keep where the newest ones lie.
  const size_t keep = kMaxExamined;  // 16 bytes each
  std::deque<Span> tail;
  auto row = [&](off_t at, size_t size) {
    if (size == 0) return;
    ++s.count;
    tail.push_back({at, size});
    if (tail.size() > keep) tail.pop_front();
  };
  std::vector<char> buf(1 << 20);
  off_t offset = 0;      // of buf's first byte in the file
  off_t line_at = 0;     // where the current line starts
  for (;;) {
    const ssize_t n = sys::retry_eintr([&] { return read(fd.get(), buf.data(), buf.size()); });
    if (n <= 0) break;
    const char* p = buf.data();
    const char* end = p + n;
    while (const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) {
      const off_t nl_at = offset + (nl - buf.data());
      row(line_at, static_cast<size_t>(nl_at - line_at));
      line_at = nl_at + 1;
      p = nl + 1;
    }
    offset += n;
  }
  row(line_at, static_cast<size_t>(offset - line_at));  // a last line without its newline
  // Back from the newest: parse until `recent` valid rows are found.
  std::vector<Json> newest_first;
  std::string text;
  for (auto it = tail.rbegin(); it != tail.rend() && newest_first.size() < recent; ++it) {
    ++s.examined;
    std::optional<Json> j;
    if (it->size <= kMaxRowBytes) {
      text.resize(it->size);
      const ssize_t got = sys::retry_eintr([&] { return pread(fd.get(), text.data(), text.size(), it->at); });
      if (got == static_cast<ssize_t>(text.size())) j = parse_incident_line(text);
    }
    if (j) {
      newest_first.push_back(std::move(*j));
    } else {
      ++s.malformed;
    }
  }
  if (!newest_first.empty()) s.latest = newest_first.front();
  s.recent.assign(std::make_move_iterator(newest_first.rbegin()), std::make_move_iterator(newest_first.rend()));
  return s;
}

}  // namespace looplock
