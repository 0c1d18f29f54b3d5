#include "records/hold.hpp"

#include <charconv>
#include <cstring>
#include <vector>

#include "base/text.hpp"
#include "os/digest.hpp"
#include "os/files.hpp"
#include "os/lock_holders.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/incident.hpp"
#include "records/lockfile.hpp"

namespace looplock {

namespace {

constexpr std::string_view kHex = "0123456789abcdef";

bool plain_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' || c == '.' ||
         c == '_' || c == '-';
}

std::string percent_encode(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    out += plain_byte(c) ? std::string(1, ch) : "%" + hex_encode(std::string_view(&ch, 1));
  }
  return out;
}

std::optional<std::string> percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      if (!plain_byte(static_cast<unsigned char>(s[i]))) return std::nullopt;
      out += s[i];
      continue;
    }
    const auto byte = i + 2 < s.size() ? hex_decode(s.substr(i + 1, 2)) : std::nullopt;
    if (!byte) return std::nullopt;
    out += *byte;
    i += 2;
  }
  return out;
}

std::vector<std::string_view> fields_of(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t at = 0;;) {
    const size_t colon = text.find(':', at);
    out.push_back(text.substr(at, colon == std::string_view::npos ? std::string_view::npos : colon - at));
    if (colon == std::string_view::npos) return out;
    at = colon + 1;
  }
}

bool all_of(std::string_view s, std::string_view allowed) {
  return !s.empty() && s.find_first_not_of(allowed) == std::string_view::npos;
}

}  // namespace

std::string format_hold_value(const HoldValue& v) {
  std::string out =
      std::to_string(v.pid) + ":" + v.start + ":" + v.secret + ":" + v.lock_id + ":" + percent_encode(v.dir);
  if (!v.etcd_key.empty()) out += ":" + percent_encode(v.etcd_key);
  return out;
}

std::optional<HoldValue> parse_hold_value(std::string_view text) {
  const auto f = fields_of(text);
  if (f.size() != 5 && f.size() != 6) return std::nullopt;
  HoldValue v;
  long long pid = 0;
  auto [p, ec] = std::from_chars(f[0].data(), f[0].data() + f[0].size(), pid);
  if (ec != std::errc() || p != f[0].data() + f[0].size() || pid <= 0 || pid > 0x7fffffff) return std::nullopt;
  v.pid = static_cast<Pid>(pid);
  if (!all_of(f[1], "0123456789") || f[2].size() != 32 || !all_of(f[2], kHex) || !all_of(f[3], kHex)) {
    return std::nullopt;
  }
  v.start = f[1];
  v.secret = f[2];
  v.lock_id = f[3];
  const auto dir = percent_decode(f[4]);
  if (!dir || dir->empty() || (*dir)[0] != '/') return std::nullopt;
  v.dir = *dir;
  if (f.size() == 6) {
    const auto key = percent_decode(f[5]);
    if (!key || key->empty()) return std::nullopt;
    v.etcd_key = *key;
  }
  return v;
}

std::optional<std::string> new_hold_secret() {
  std::string out;
  while (out.size() < 32) {
    const auto r = sys::random_below(1ULL << 48);
    if (!r) return std::nullopt;
    for (int i = 0; i < 12 && out.size() < 32; ++i) out += kHex[(*r >> (4 * i)) & 15];
  }
  return out;
}

HoldCheck check_hold(const HoldValue& v, int dirfd, const sys::FileStatus& lock_file) {
  HoldCheck c;
  const UniqueFd fd = sys::open_in(dirfd, record_name(), {.access = sys::OpenIn::Access::Read});
  const int open_err = fd ? 0 : errno;
  const HolderRead read = fd ? read_holder(fd.get()) : HolderRead{};
  c.record = read.record;
  const HolderRecord* r = read.record ? &*read.record : nullptr;
  if (!fd || read.state == HolderRead::State::Error) {
    c.unreadable = true;
    c.why = "cannot be confirmed: the holder record cannot be read (" +
            std::string(strerror(fd ? (read.err ? read.err : EIO) : open_err)) + ")";
  } else if (r && r->released_at && r->pid == v.pid && r->pid_start == v.start) {
    const bool tie_gone = r->hold && r->hold->tied_to != 0 && sys::process_start(r->hold->tied_to) != r->hold->tied_start;
    c.why = "has ended (its holder let go at " + *r->released_at +
            (tie_gone ? "; the process it was tied to, pid " + std::to_string(r->hold->tied_to) + ", has ended" : "") +
            ")";
  } else if (!r) {
    c.why = "is not the lock's holder (its holder record names no run)";
  } else if (r->released_at || r->pid != v.pid || r->pid_start != v.start) {
    const std::string who = "pid " + std::to_string(r->pid) + " (operation " + printable(r->operation) + ")";
    c.why = "is not the lock's holder (its holder record names " +
            (r->pid == v.pid && r->pid_start != v.start ? "another process with the hold's pid, " + who
                                                        : "another run, " + who) +
            (r->released_at ? ", which let go at " + *r->released_at : ", which holds it") + ")";
  } else if (!r->hold || r->lock_id != v.lock_id || r->hold->secret_sha256 != sys::sha256_hex(v.secret)) {
    c.why = "does not match the holder record (another lock's value, or a wrong secret)";
  } else if (sys::process_start(v.pid) != v.start) {
    c.why = "has ended (process " + std::to_string(v.pid) + " is gone)";
  } else if (const auto table = sys::lock_table(lock_file); !table) {
    c.why = "cannot be confirmed: the system's lock table cannot be read (" + std::string(strerror(errno)) + ")";
  } else {
    for (const auto& h : table->holders) {
      if (h.exclusive && (h.pid == v.pid || h.locked_by == v.pid)) c.live = true;
    }
    if (!c.live) {
      c.why = "is not holding the lock (the kernel lists no lock of process " + std::to_string(v.pid) +
              " on it: it has exited, or let go)";
    }
  }
  return c;
}

std::optional<int> hold_ended_by(int dirfd, Pid pid, const std::string& start, const std::string& secret_sha256) {
  const IncidentSummary rows = summarize_incidents(dirfd, 64);
  for (auto it = rows.recent.rbegin(); it != rows.recent.rend(); ++it) {
    const Json& row = *it;
    if (!row.contains("holder") || !row["holder"].is_object()) continue;
    const auto holder = holder_from_json(row["holder"]);
    if (!holder || holder->pid != pid || holder->pid_start != start || !holder->hold ||
        holder->hold->secret_sha256 != secret_sha256)
      continue;
    const std::string code = row.value("error_code", "");
    if (code == "max_time_exceeded") return 124;
    if (code == "lease_lost") return 76;
  }
  return std::nullopt;
}

}  // namespace looplock
