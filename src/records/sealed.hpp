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
#include <vector>

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

// Files that keep two (or, while they grow, three) sealed copies, so that a write cut short (a full
// disk, a file-size limit, a quota, EIO, a crash) never touches the only
// valid one: the run ledger (ledger.hpp). Each copy is one line; a reader
// takes every line that unseals with its check, and the writer puts the
// next copy where it overlaps none of the newest valid one.
struct SealedCopy {
  std::string_view object;  // as unseal() gives it
  size_t begin = 0;         // its line's first byte in the file's text
  size_t end = 0;           // one past its newline
};
// The checked copies of `content`, in file order: each line that unseals
// with a check, once the NUL bytes (space reserved and never written) and
// spaces before it are skipped. Lines that do not (a torn copy, an older
// one's tail) are no copies.
std::vector<SealedCopy> sealed_copies(std::string_view content);
// Where a new copy `data` (ending with a newline) goes beside the newest
// valid copy at [keep_begin, keep_end) of a file of `file_size` bytes: at
// its start when it fits before the kept copy (padded with spaces to end
// where the kept copy begins), else right after the kept copy (padded to
// the file's end when the rest of the file is longer, so that no older
// line's tail is left behind it). Returns the offset and the padded data.
struct Placement {
  long long offset = 0;
  std::string data;
};
Placement place_copy(std::string data, size_t keep_begin, size_t keep_end, long long file_size);

// Writes `data` (ending with a newline) over fd's content from offset 0,
// padded with spaces before the newline to the file's size when that is
// larger; a file larger than `max_padded` is truncated first. False with
// errno set on failure.
bool write_over(int fd, std::string data, long long max_padded);

}  // namespace looplock
