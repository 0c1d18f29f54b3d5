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

std::vector<SealedCopy> sealed_copies(std::string_view content) {
  std::vector<SealedCopy> out;
  for (size_t at = 0; at < content.size();) {
    const size_t nl = content.find('\n', at);
    if (nl == std::string_view::npos) break;  // a tail without its newline: a copy cut short
    size_t begin = at;
    while (begin < nl && (content[begin] == '\0' || content[begin] == ' ')) ++begin;
    if (const auto u = unseal(content.substr(begin, nl + 1 - begin)); u && u->checked) {
      out.push_back({u->object, begin, nl + 1});
    }
    at = nl + 1;
  }
  return out;
}

Placement place_copy(std::string data, size_t keep_begin, size_t keep_end, long long file_size) {
  if (data.size() <= keep_begin) {
    data.insert(data.size() - 1, keep_begin - data.size(), ' ');
    return {0, std::move(data)};
  }
  const long long rest = file_size - static_cast<long long>(keep_end);
  if (rest > static_cast<long long>(data.size())) {
    data.insert(data.size() - 1, static_cast<size_t>(rest) - data.size(), ' ');
  }
  return {static_cast<long long>(keep_end), std::move(data)};
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
