// Everything looplock says goes to stderr through a Logger: one line per
// message, "looplock: ..." as text, or one JSON object per line with
// --log-format json. The Logger is built from the options and passed down.
#pragma once

#include <string>
#include <string_view>

#include "base/json.hpp"
#include "base/text.hpp"

namespace looplock {

enum class Verbosity { Quiet, Normal, Verbose };
enum class LogFormat { Text, Json };

// Where every event goes besides stderr, whatever -q or -v let through
// (--notify: run/notify.hpp): each as the JSON object --log-format json
// writes.
class EventSink {
public:
  virtual ~EventSink() = default;
  virtual void take(const Json& event) = 0;
};

class Logger {
public:
  Logger(Verbosity verbosity, LogFormat format, int fd = 2);

  // From now on, JSON lines carry "lock_id" (once the run knows it).
  void set_lock_id(std::string lock_id) { lock_id_ = std::move(lock_id); }

  // Errors are always printed. `hint` becomes a second line.
  void error(const std::string& event, const std::string& message, const std::string& hint = {},
             const Json& fields = {}) const;
  // Warnings are printed unless --quiet.
  void warn(const std::string& event, const std::string& message, const Json& fields = {}) const;
  // A warning that --quiet does not hide (a lock left held by what the
  // command started).
  void warn_always(const std::string& event, const std::string& message, const Json& fields = {}) const;
  // A result line (noop-locked): printed unless --quiet. A healthy skip
  // under cron must not mail; its exit status and the metrics still tell it.
  void result(const std::string& event, const std::string& message, const Json& fields = {}) const;
  // Progress, printed only with --verbose.
  void verbose(const std::string& event, const std::string& message, const Json& fields = {}) const;
  // An event only the sink hears (--notify's started, ended, skipped): never printed.
  void event(const char* level, const std::string& event, const std::string& message, const Json& fields = {}) const;

  // From now on, every event also goes to `sink` (null: none).
  void set_sink(EventSink* sink) { sink_ = sink; }
  // Whether a sink listens: an event only it hears is not even built without one.
  bool has_sink() const { return sink_ != nullptr; }

  bool is_verbose() const { return verbosity_ == Verbosity::Verbose; }
  bool is_quiet() const { return verbosity_ == Verbosity::Quiet; }
  bool is_text() const { return format_ == LogFormat::Text; }
  int fd() const { return fd_; }

  // The line as it would be written (exposed for unit tests).
  std::string format_line(const char* level, const std::string& event, const std::string& message,
                          const std::string& hint, const Json& fields) const;

  // The event as one JSON object (--log-format json's line).
  Json as_json(const char* level, const std::string& event, const std::string& message, const std::string& hint,
               const Json& fields) const;

private:
  void offer(const char* level, const std::string& event, const std::string& message, const std::string& hint,
             const Json& fields) const;
  void emit(const char* level, const std::string& event, const std::string& message, const std::string& hint,
            const Json& fields) const;

  Verbosity verbosity_;
  LogFormat format_;
  int fd_;
  // Filled in by the run that owns the Logger, once known (a detail of what
  // is printed, not state the run depends on).
  std::string lock_id_;
  EventSink* sink_ = nullptr;
};

}  // namespace looplock
