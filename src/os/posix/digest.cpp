// SHA-256 on POSIX: nettle's (linked statically into looplock, meson.build).
#include <nettle/sha2.h>

#include <array>
#include <string_view>

namespace looplock::sys {

std::array<unsigned char, 32> sha256(std::string_view data) {
  static_assert(SHA256_DIGEST_SIZE == 32);
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  std::array<unsigned char, 32> digest{};
  sha256_digest(&ctx, digest.size(), digest.data());
  return digest;
}

}  // namespace looplock::sys
