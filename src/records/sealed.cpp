#include "records/sealed.hpp"

#include <algorithm>

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

std::vector<Span> line_spans(std::string_view content) {
  std::vector<Span> out;
  for (size_t at = 0; at < content.size();) {
    const size_t nl = content.find('\n', at);
    if (nl == std::string_view::npos) break;  // a tail without its newline: a copy cut short
    out.push_back({at, nl + 1});
    at = nl + 1;
  }
  return out;
}

std::optional<SealedCopy> sealed_copy_at(std::string_view content, Span line) {
  size_t begin = line.begin;
  while (begin < line.end && (content[begin] == '\0' || content[begin] == ' ')) ++begin;
  if (const auto u = unseal(content.substr(begin, line.end - begin)); u && u->checked) {
    return SealedCopy{u->object, line.begin, line.end};
  }
  return std::nullopt;
}

std::vector<SealedCopy> sealed_copies(std::string_view content) {
  std::vector<SealedCopy> out;
  for (const Span& line : line_spans(content)) {
    if (auto c = sealed_copy_at(content, line)) out.push_back(*c);
  }
  return out;
}

std::optional<Placement> place_copy(std::string data, std::vector<Span> keep, size_t max_end) {
  std::sort(keep.begin(), keep.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const Span& k : keep) {
    if (at + data.size() <= k.begin) break;  // fits in the gap before it
    at = std::max(at, k.end);
  }
  if (at + data.size() > max_end) return std::nullopt;
  return Placement{static_cast<long long>(at), std::move(data)};
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
