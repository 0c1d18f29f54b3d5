// digest.hpp's part that is the same on every system: the hex digits.
#include "os/digest.hpp"

#include <array>

namespace looplock::sys {

std::array<unsigned char, 32> sha256(std::string_view data);  // posix/ or windows/digest.cpp

std::string sha256_hex(std::string_view data) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (const unsigned char b : sha256(data)) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace looplock::sys
