// A hold across steps: `looplock --hold --max-time DURATION [--tied-to PID]
// DIR` forks a holder (os/hold_process.hpp) that runs as an ordinary run of
// DIR whose command is looplock's own sentinel; the caller prints
// LOOPLOCK_HOLD=VALUE (records/hold.hpp) once the holder reports that it
// holds every lock, and exits 0. The holder's records, rows and ends are a
// run's: --max-time (124), a lost lease (76), its sentinel's end on
// --release's TERM or when the tied process exits.
#pragma once

#include <optional>

#include "base/log.hpp"
#include "run/stack.hpp"
#include "settings/settings.hpp"

namespace looplock {

// The sentinel's argument: `looplock --hold-sentinel REPORT_FD [PID START]`
// is the command of a hold (never typed by anyone; not an option).
inline constexpr std::string_view kSentinelArg = "--hold-sentinel";

// Runs the sentinel when argv asks for it (returns its exit status), else
// nullopt.
std::optional<int> sentinel_main(int argc, char** argv);

// In the caller: forks the holder and returns the caller's exit status once
// the holder holds the lock (0, the line printed) or has ended without it
// (its status: 75, -E, 64, ...). In the holder: returns nullopt, with `o`
// and `ctx` made the holder's (the sentinel as the command, DIR absolute,
// the hold's facts, its own pid and the on_held report), to go on as a run.
std::optional<int> start_hold(Options& o, Context& ctx, const Logger& log);

}  // namespace looplock
