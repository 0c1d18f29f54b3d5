// looplock's exit statuses: the one table, repeated in man/looplock.1.scd
// (EXIT STATUS) and README.md. Values follow <sysexits.h> where one fits.
#pragma once

namespace looplock::exit_code {

// The command's own status (0-255) passes through unchanged; a command killed
// by signal S makes looplock die of S too.
inline constexpr int kOk = 0;
inline constexpr int kCheckWarned = 1;  // --inspect --check: a report carries a warning
inline constexpr int kUsage = 64;       // EX_USAGE: bad command line
inline constexpr int kNoInput = 66;     // EX_NOINPUT: DIR missing or not a directory
inline constexpr int kClusterUnavailable =
    69;  // EX_UNAVAILABLE: no etcd endpoint answered at acquisition, or looplock-etcd is missing
inline constexpr int kOsError = 71;     // EX_OSERR: fork, ENOLCK, EMFILE, ...
inline constexpr int kCantCreate = 73;  // EX_CANTCREAT: lock file cannot be opened, or is unsafe
inline constexpr int kVanished = 74;    // EX_IOERR: lock file or DIR vanished mid-lock
inline constexpr int kTimeout = 75;     // EX_TEMPFAIL: deadline passed (default of -E)
inline constexpr int kLeaseLost = 76;   // EX_PROTOCOL: the etcd lease was lost while the command ran
inline constexpr int kMaxTime = 124;    // --max-time passed and the job was ended (as timeout(1))
inline constexpr int kNotExecutable = 126;
inline constexpr int kNotFound = 127;

}  // namespace looplock::exit_code
