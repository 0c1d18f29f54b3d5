#include "records/sealed.hpp"

#include "os/digest.hpp"
#include "os/file_status.hpp"
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
  // The file's size: how much to pad (it is never shrunk), then one write at its start.
  sys::FileStatus st;
  if (!sys::status_of_fd(fd, st)) return false;
  if (st.size > max_padded) {
    if (!sys::truncate_fd(fd, 0)) return false;
  } else if (static_cast<size_t>(st.size) > data.size()) {
    data.insert(data.size() - 1, static_cast<size_t>(st.size) - data.size(), ' ');
  }
  return sys::pwrite_all(fd, data);
}

}  // namespace looplock
