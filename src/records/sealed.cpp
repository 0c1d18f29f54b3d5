#include "records/sealed.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "os/digest.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {
constexpr std::string_view kCheckKey = ",\"check\":\"";
constexpr size_t kCheckDigits = 16;
}  // namespace

std::string check_of(std::string_view body) { return sys::sha256_hex(body).substr(0, kCheckDigits); }

std::string seal(const std::string& body) { return body + std::string(kCheckKey) + check_of(body) + "\"}\n"; }

std::optional<Unsealed> unseal(std::string_view content) {
  if (content.empty() || content.back() != '\n') return std::nullopt;  // it ends with its newline
  content.remove_suffix(1);
  while (!content.empty() && content.back() == ' ') content.remove_suffix(1);  // padding
  if (content.empty() || content.front() != '{' || content.back() != '}') return std::nullopt;
  const size_t at = content.rfind(kCheckKey);
  if (at == std::string_view::npos) return Unsealed{content, false};
  const std::string_view digits = content.substr(at + kCheckKey.size());
  if (digits.size() != kCheckDigits + 2 || digits.substr(kCheckDigits) != "\"}" ||
      digits.substr(0, kCheckDigits) != check_of(content.substr(0, at))) {
    return std::nullopt;
  }
  return Unsealed{content, true};
}

bool write_over(int fd, std::string data, long long max_padded) {
  // fstat(2): how much to pad (the file is never shrunk), then one pwrite(2).
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  if (st.st_size > max_padded) {
    if (sys::retry_eintr([&] { return ftruncate(fd, 0); }) != 0) return false;
  } else if (static_cast<size_t>(st.st_size) > data.size()) {
    data.insert(data.size() - 1, static_cast<size_t>(st.st_size) - data.size(), ' ');
  }
  return sys::pwrite_all(fd, data);
}

}  // namespace looplock
