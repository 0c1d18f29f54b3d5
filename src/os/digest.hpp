// SHA-256, from the system's own implementation (posix/: nettle; windows/:
// BCrypt), for lock ids and the checks of sealed records.
#pragma once

#include <string>
#include <string_view>

namespace looplock::sys {

// The SHA-256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace looplock::sys
