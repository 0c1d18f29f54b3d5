#include "records/incident.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <iterator>

#include "base/log.hpp"
#include "os/clock.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
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
  const UniqueFd fd = sys::open_in(dirfd, kIncidentsName,
                                   {.access = sys::OpenIn::Access::ReadWrite,
                                    .create = sys::OpenIn::Create::IfMissing,
                                    .mode = kCreateMode,
                                    .append = true});
  if (!fd) return errno;
  sys::FileStatus st;
  if (!sys::status_of_fd(fd.get(), st)) return errno;
  if (!st.regular()) return EINVAL;
  if (st.links != 1) return EMLINK;
  // A row cut short earlier (a full disk, a file-size limit) ends without a
  // newline: this one then starts on a line of its own instead of being
  // glued to it (readers count the damaged line and skip it). Appenders
  // take a lock on the incidents file (not the lock they wait for) for
  // the look and the write, so that none takes another's row, half written
  // across a page, for a damaged one; briefly: past 100 ms it appends
  // without looking. (Where locks are byte ranges that deny other handles,
  // the lock lies past the data, so that readers of the file never meet it.)
  bool locked = false;
  for (int i = 0; i < 100 && !(locked = sys::try_lock(fd.get(), /*exclusive=*/true, sys::LockAt::PastData)); ++i) {
    nap(std::chrono::milliseconds(1));
  }
  std::optional<std::string> last;
  const bool cut = locked && sys::status_of_fd(fd.get(), st) && st.size > 0 &&
                   (last = sys::pread_all(fd.get(), 1, st.size - 1)) && *last != "\n" && last->size() == 1;
  std::string row(cut ? 1 : 0, '\n');
  row += line;
  return sys::append_row(fd.get(), row) ? 0 : errno;
}

namespace {

// Where a row lies in the file.
struct Span {
  long long at = 0;
  size_t size = 0;
};
constexpr size_t kMaxRowBytes = 1 << 20;  // a longer line is a runaway: malformed, never read

}  // namespace

IncidentSummary summarize_incidents(int dirfd, size_t recent) {
  IncidentSummary s;
  const UniqueFd fd = sys::open_in(dirfd, kIncidentsName, {.access = sys::OpenIn::Access::Read});
  if (!fd) {
    if (errno != ENOENT) s.error = errno;  // a symlink (ELOOP), a permission
    return s;
  }
  sys::FileStatus st;
  if (!sys::status_of_fd(fd.get(), st)) {
    s.error = errno;
    return s;
  }
  if (!st.regular()) {
    s.error = EINVAL;  // lock_files.hpp says what it is instead
    return s;
  }
  s.exists = true;
  // One pass: count the rows, and keep where the newest ones lie.
  const size_t keep = kMaxExamined;  // 16 bytes each
  std::deque<Span> tail;
  auto row = [&](long long at, size_t size) {
    if (size == 0) return;
    ++s.count;
    tail.push_back({at, size});
    if (tail.size() > keep) tail.pop_front();
  };
  long long offset = 0;   // of the chunk's first byte in the file
  long long line_at = 0;  // where the current line starts
  for (;;) {
    const auto chunk = sys::pread_some(fd.get(), 1 << 20, offset);
    if (!chunk || chunk->empty()) break;
    const char* p = chunk->data();
    const char* end = p + chunk->size();
    while (const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) {
      const long long nl_at = offset + (nl - chunk->data());
      row(line_at, static_cast<size_t>(nl_at - line_at));
      line_at = nl_at + 1;
      p = nl + 1;
    }
    offset += static_cast<long long>(chunk->size());
  }
  row(line_at, static_cast<size_t>(offset - line_at));  // a last line without its newline
  // Back from the newest: parse until `recent` valid rows are found.
  std::vector<Json> newest_first;
  for (auto it = tail.rbegin(); it != tail.rend() && newest_first.size() < recent; ++it) {
    ++s.examined;
    std::optional<Json> j;
    if (it->size <= kMaxRowBytes) {
      const auto text = sys::pread_some(fd.get(), it->size, it->at);
      if (text && text->size() == it->size) j = parse_incident_line(*text);
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
