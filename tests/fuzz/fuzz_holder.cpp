// libFuzzer target: the holder-record parser must never crash, and anything
// it accepts must survive an encode/parse round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "records/holder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto r = looplock::parse_holder(in)) {
    auto again = looplock::parse_holder(looplock::encode_holder(*r));
    if (!again || again->pid != r->pid || again->lock_id != r->lock_id || again->released_at != r->released_at) {
      std::abort();
    }
  }
  return 0;
}
