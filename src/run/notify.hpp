// --notify (looplock-events(7), NOTIFY): the run's events, each the JSON object
// --log-format json writes, delivered one at a time and in order to the
// operator's command by a relay process (os/relay.hpp), so that a slow or
// hanging notifier never delays a release or a hand-off. The relay also
// keeps --notify-after's clock: once the job has run that long without
// ending, it says held_too_long (once). The notifier never gets the lock:
// the relay is started before DIR is opened, and the notifier's environment
// has no LOOPLOCK_FD, LOOPLOCK_HOLDER_PID or LOOPLOCK_HOLDER_FD, so that a
// looplock in it does not pass for nested.
#pragma once

#include <optional>
#include <string>

#include "base/environment.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/outcome.hpp"
#include "os/relay.hpp"
#include "settings/settings.hpp"

namespace looplock {

class Notifier final : public EventSink {
public:
  // Starts the relay; when it cannot be started, says so (a warning,
  // notify_unavailable) and the run goes on without it.
  Notifier(const NotifySettings& settings, const EnvList& env, const Logger& log);
  ~Notifier() override;
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  void take(const Json& event) override;
  // No more events: waits until the relay has delivered the last one.
  void finish();

private:
  const Logger& log_;
  std::optional<sys::Relay> relay_;
};

// --notify's ended (the run's last event): outcome, exit status, how long
// the command ran and, when the wait gave up, how long it waited; built
// only when a notifier listens.
void say_ended(const Logger& log, const std::string& operation, RunOutcome outcome, int exit_status, Duration ran,
               std::optional<Duration> waited = std::nullopt, const Json& more = Json::object());

// The pure parts, for the tests. Whether `event` (at `level`) is one to
// deliver: those --notify-on names ("all": every event), or by default
// every warning and error and held_too_long.
bool notify_wanted(const NotifySettings& settings, const std::string& event, const std::string& level);
// The notifier's environment: looplock's, without what names a held lock,
// with LOOPLOCK_EVENT.
EnvList notifier_env(const EnvList& env, const std::string& event);
// Why --notify-on cannot name `name` (no such event, or one a run never
// notifies), or nullopt when it can ("all" included).
std::optional<std::string> unnotifiable_event(const std::string& name);
// held_too_long, from the started event of the job that has now run `held`.
Json held_too_long_event(const Json& started, Duration held, Duration after);

}  // namespace looplock
