// --notify's relay (looplock-events(7), NOTIFY): a process of looplock's own that
// reads events from a pipe and runs the operator's notifier for each, one at
// a time, so that a slow or hanging notifier never delays the lock's
// release or a hand-off. The relay is started before looplock opens DIR (it
// never holds a lock's descriptor), in a process group of its own (a Ctrl-C
// or timeout(1)'s TERM to looplock's group does not reach it); it ends once
// looplock closes the pipe and its last event is delivered (also when
// looplock is killed). Each notifier runs through the shell in a process
// group of its own, the event on its standard input, and is KILLed with its
// group at its deadline. posix/relay.cpp: fork(2) and waitpid(2); windows/:
// not yet (looplock.exe refuses --notify).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "os/clock.hpp"
#include "os/ids.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

struct Relay {
  UniqueFd events;      // the pipe's write end (non-blocking): one line per event
  Pid pid = 0;
  std::string pending;  // what the pipe had no room for yet, sent first
  size_t dropped = 0;   // events dropped: the relay was that far behind
};

// Starts the relay, which runs `body` with the pipe's read end and exits
// with what it returns; nullopt (errno set) when it cannot be started.
std::optional<Relay> start_relay(const std::function<int(int events)>& body);
// Sends one event's line to the relay without ever blocking: what the pipe
// has no room for waits in `pending` (up to 1 MiB; past that the event is
// dropped and counted); a relay that is gone loses the rest.
void send_event(Relay& relay, std::string line);
// Sends what is pending, closes the pipe and waits for the relay to deliver
// what it has and exit; a signal that would end looplock (INT, TERM, HUP,
// QUIT) ends the wait early, and the relay goes on delivering on its own.
void finish_relay(Relay& relay);

// Waits until `fd` can be read (true) or `until` comes (false; none: for
// ever).
bool wait_readable(int fd, Deadline until);
// Reads what `fd` has now, at most `limit` bytes (empty: its end).
std::optional<std::string> read_some(int fd, size_t limit);

// How a notifier ended.
struct NotifierEnd {
  bool started = false;
  int err = 0;             // not started: why
  bool timed_out = false;  // KILLed with its group at its deadline
  int status = 0;          // its wait status
  std::string output;      // the end of what it wrote (stdout and stderr), at most 1 KiB
};
// Runs `command` through the shell (/bin/sh -c) with `env`, `input` on its
// standard input, its standard output and error read by the relay (never
// looplock's), in a process group of its own, KILLed with the group after
// `timeout` (kForever: never) and once it has exited (what it left behind).
// No write or read of the relay's blocks: the input is written as the
// notifier reads it, its output read meanwhile, so that the timeout holds
// whatever the event's size and whatever the notifier does with its
// standard input and output.
NotifierEnd run_notifier(const std::string& command, const std::vector<std::string>& env, const std::string& input,
                         Duration timeout);

}  // namespace looplock::sys
