// libFuzzer target: the incident-row parser must never crash, and an
// accepted row must keep validating after it is serialised again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/log.hpp"
#include "records/incident.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto j = looplock::parse_incident_line(in)) {
    if (!looplock::parse_incident_line(looplock::dump_json(*j))) std::abort();
  }
  return 0;
}
