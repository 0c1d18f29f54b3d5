// The holder record: who holds the lock, written into DIR/.state.lock after
// an exclusive acquisition (schema file_lock_holder_v0). Written in place
// (one pwrite at offset 0, padded to the old length) because the lock lives
// on the inode and the file must never be replaced; readers validate the
// whole content (one JSON object, nothing after it but padding, a matching
// "check") and retry, so a half-written or torn record is never taken for a
// whole one.
#pragma once

#include "base/hold_facts.hpp"
#include "base/json.hpp"
#include "os/ids.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace looplock {

inline constexpr std::string_view kHolderSchema = "file_lock_holder_v0";
// agent_id and operation are cut to this many bytes in records, so that a
// record always fits in one page.
inline constexpr size_t kMaxIdentityBytes = 256;

struct HolderRecord {
  std::string lock_id;
  Pid pid = 0;
  std::string pid_start;
  std::string agent_id;
  std::string operation;
  std::string policy;
  std::string acquired_at;
  std::optional<std::string> released_at;
  // An -F run: the command holds the lock and nobody is left to write the
  // release. Written as "no_fork":true only when set (older readers ignore it).
  bool no_fork = false;
  // --holders N: N, and the index this holder took (0 to N-1), written as
  // "holders" and "index" only then (a record without them is the one
  // exclusive holder's).
  int holders = 0;
  int index = 0;
  // --hold: the hold's tie, end and secret's hash, written as "hold" only
  // then.
  std::optional<HoldFacts> hold;
};

Json holder_to_json(const HolderRecord& r);
std::optional<HolderRecord> holder_from_json(const Json& j);

// One JSON object and a newline; invalid UTF-8 replaced by U+FFFD. Its last
// field, "check", is the first 16 hex digits of the SHA-256 of the text
// before ',"check":"', so that a reader can tell a record it read while the
// record was being rewritten (part old, part new) from a whole one.
std::string encode_holder(const HolderRecord& r);
std::string holder_check(std::string_view body);
// Strict: exactly one JSON object (then optional space padding) followed by
// its newline, with the schema and every field of the right type, and a
// matching "check" when there is one; nullopt otherwise.
std::optional<HolderRecord> parse_holder(std::string_view content);

// Writes the record over the file's content in place (the lock lives on the
// inode: the file is never replaced), padded with spaces to the old length so
// that it never has to shrink. Returns false with errno set on failure.
bool write_holder(int fd, const HolderRecord& r);

struct HolderRead {
  enum class State { Empty, Valid, Unreadable, Error };
  State state = State::Empty;
  std::optional<HolderRecord> record;
  size_t size = 0;  // bytes found in the file (at most the read limit)
  int err = 0;      // Error: why the file could not be opened or read
};

// Reads and validates the record, retrying a few times (a few ms apart) while
// the content does not validate, since a holder may be writing it.
HolderRead read_holder(int fd);

// Cuts to at most `max` bytes (the JSON encoder then replaces any sequence cut
// in half).
std::string clip_bytes(std::string s, size_t max = kMaxIdentityBytes);

}  // namespace looplock
