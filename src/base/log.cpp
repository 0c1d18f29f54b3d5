#include "base/log.hpp"

#include "os/sys.hpp"

namespace looplock {

Logger::Logger(Verbosity verbosity, LogFormat format, int fd) : verbosity_(verbosity), format_(format), fd_(fd) {}

Json Logger::as_json(const char* level, const std::string& event, const std::string& message, const std::string& hint,
                     const Json& fields) const {
  Json j = Json::object();
  j["ts"] = sys::utc_now_iso8601();
  j["pid"] = static_cast<long>(sys::own_pid());  // asked here: most runs write no JSON line
  j["level"] = level;
  j["event"] = event;
  if (!lock_id_.empty()) j["lock_id"] = lock_id_;
  j["message"] = message;
  if (!hint.empty()) j["hint"] = hint;
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  }
  return j;
}

std::string Logger::format_line(const char* level, const std::string& event, const std::string& message,
                                const std::string& hint, const Json& fields) const {
  if (format_ == LogFormat::Json) return dump_json(as_json(level, event, message, hint, fields)) + "\n";
  std::string line = "looplock: " + printable(message) + "\n";
  if (!hint.empty()) line += "looplock: " + printable(hint) + "\n";
  return line;
}

void Logger::emit(const char* level, const std::string& event, const std::string& message, const std::string& hint,
                  const Json& fields) const {
  // One write(2) per message, so that lines from concurrent processes on a
  // shared stderr do not interleave. A failed write to stderr is ignored: there
  // is nowhere else to report it.
  (void)sys::write_all(fd_, format_line(level, event, message, hint, fields));
}

void Logger::offer(const char* level, const std::string& event, const std::string& message, const std::string& hint,
                   const Json& fields) const {
  if (sink_) sink_->take(as_json(level, event, message, hint, fields));
}

void Logger::error(const std::string& event, const std::string& message, const std::string& hint,
                   const Json& fields) const {
  offer("error", event, message, hint, fields);
  emit("error", event, message, hint, fields);
}

void Logger::warn(const std::string& event, const std::string& message, const Json& fields) const {
  offer("warning", event, message, {}, fields);
  if (verbosity_ != Verbosity::Quiet) emit("warning", event, message, {}, fields);
}

void Logger::warn_always(const std::string& event, const std::string& message, const Json& fields) const {
  offer("warning", event, message, {}, fields);
  emit("warning", event, message, {}, fields);
}

void Logger::result(const std::string& event, const std::string& message, const Json& fields) const {
  offer("notice", event, message, {}, fields);
  if (verbosity_ != Verbosity::Quiet) emit("notice", event, message, {}, fields);
}

void Logger::verbose(const std::string& event, const std::string& message, const Json& fields) const {
  offer("info", event, message, {}, fields);
  if (verbosity_ == Verbosity::Verbose) emit("info", event, message, {}, fields);
}

void Logger::event(const char* level, const std::string& event, const std::string& message, const Json& fields) const {
  offer(level, event, message, {}, fields);
}

}  // namespace looplock
