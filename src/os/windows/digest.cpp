// SHA-256 on Windows: BCrypt's.
// windows.h first: bcrypt.h needs what it declares.
// clang-format off
#include <windows.h>
#include <bcrypt.h>
// clang-format on

#include <algorithm>
#include <array>
#include <climits>
#include <stdexcept>
#include <string_view>

namespace looplock::sys {

std::array<unsigned char, 32> sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  BCRYPT_ALG_HANDLE alg = nullptr;
  BCRYPT_HASH_HANDLE hash = nullptr;
  bool ok = BCryptOpenAlgorithmProvider(&alg, BCRYPT_SHA256_ALGORITHM, nullptr, 0) == 0 &&
            BCryptCreateHash(alg, &hash, nullptr, 0, nullptr, 0, 0) == 0;
  while (ok && !data.empty()) {
    const ULONG chunk = static_cast<ULONG>(std::min<size_t>(data.size(), ULONG_MAX));
    ok = BCryptHashData(hash, reinterpret_cast<PUCHAR>(const_cast<char*>(data.data())), chunk, 0) == 0;
    data.remove_prefix(chunk);
  }
  ok = ok && BCryptFinishHash(hash, digest.data(), static_cast<ULONG>(digest.size()), 0) == 0;
  if (hash) BCryptDestroyHash(hash);
  if (alg) BCryptCloseAlgorithmProvider(alg, 0);
  // Only an exhausted system fails here; a lock id must never be a guess.
  if (!ok) throw std::runtime_error("BCrypt's SHA-256 failed");
  return digest;
}

}  // namespace looplock::sys
