#include "base/json.hpp"

namespace looplock {

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace looplock
