// Files that are rewritten in place, and read without the writer's lock: a
// JSON object whose last field, "check", is the first 16 hex digits of the
// SHA-256 of the text before ',"check":"', so that a reader can tell a text
// it read while it was being rewritten (part old, part new) from a whole
// one; and the in-place write itself, padded so that the file never shrinks
// (ftruncate(2) or a rename costs ext4 a journal transaction on every run).
// The holder record (holder.hpp) and the run ledger (ledger.hpp) use them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace looplock {

// The check of `body` (the object's text before ',"check":"').
std::string check_of(std::string_view body);

// `body` is an object's text without its closing brace ("{...");
// returns it sealed: body + ',"check":"' + check_of(body) + '"}' + "\n".
std::string seal(const std::string& body);

struct Unsealed {
  std::string_view object;  // the object's text, padding and newline removed
  bool checked = false;     // it had a check (which matched)
};
// A file's text: one object, then optional space padding, then a newline.
// nullopt when it is not that, or when its check does not match.
std::optional<Unsealed> unseal(std::string_view content);

// Writes `data` (ending with a newline) over fd's content from offset 0,
// padded with spaces before the newline to the file's size when that is
// larger; a file larger than `max_padded` is truncated first. False with
// errno set on failure.
bool write_over(int fd, std::string data, long long max_padded);

}  // namespace looplock
