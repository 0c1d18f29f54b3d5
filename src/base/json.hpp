// JSON as looplock writes it: records, incident rows, log lines, reports.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace looplock {

// Insertion-ordered JSON, so records read in the documented order
// ({"schema":..., "lock_id":..., ...}).
using Json = nlohmann::ordered_json;

// One line of JSON; invalid UTF-8 becomes U+FFFD, never an exception.
std::string dump_json(const Json& j);

}  // namespace looplock
