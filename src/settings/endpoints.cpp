#include "settings/endpoints.hpp"

#include <charconv>

#include "base/text.hpp"

namespace looplock::etcd {

namespace {

std::optional<int> parse_port(std::string_view text) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v < 1 || v > 65535) return std::nullopt;
  return v;
}

}  // namespace

ParsedEndpoints parse_endpoints(std::string_view text) {
  ParsedEndpoints out;
  auto fail = [&](std::string why) {
    out.endpoints.clear();
    out.error = std::move(why);
    return out;
  };
  if (text.empty()) return fail("no endpoint");
  size_t start = 0;
  for (;;) {
    size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::string shown(item);
    Endpoint e;
    if (item.starts_with("https://")) {
      e.tls = true;
      item.remove_prefix(8);
    } else if (item.starts_with("http://")) {
      item.remove_prefix(7);
    } else {
      return fail(quote(shown) + " does not start with http:// or https://");
    }
    const std::string scheme = e.tls ? "https://" : "http://";
    if (item.ends_with('/')) item.remove_suffix(1);
    e.text = scheme + std::string(item);
    size_t colon;
    if (item.starts_with('[')) {
      size_t close = item.find(']');
      if (close == std::string_view::npos || close + 1 >= item.size() || item[close + 1] != ':') {
        return fail(quote(shown) + ": expected " + scheme + "[IPV6]:PORT");
      }
      e.host = std::string(item.substr(1, close - 1));
      colon = close + 1;
    } else {
      colon = item.rfind(':');
      if (colon == std::string_view::npos) return fail(quote(shown) + " has no :PORT");
      e.host = std::string(item.substr(0, colon));
    }
    auto port = parse_port(item.substr(colon + 1));
    if (!port) return fail(quote(shown) + " has no valid port (1-65535)");
    e.port = *port;
    if (e.host.empty() || e.host.find_first_of("/?#@ \t") != std::string::npos) {
      return fail(quote(shown) + " has no valid host");
    }
    out.endpoints.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace looplock::etcd
