// A hold across steps (--hold): the value LOOPLOCK_HOLD carries from the
// step that took the hold to the later ones, and whether the hold it names
// holds this lock now. The value names the holder process (pid and start
// time), a random secret (its SHA-256 is in the holder record), the lock
// (its id and DIR) and, with --etcd, the cluster key. A later run trusts it
// only when the holder record and the kernel agree: the record is the
// hold's, with that pid, start and secret, and /proc/locks shows that very
// process holding this lock file (a copied, stale or forged value never
// passes).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "records/holder.hpp"

namespace looplock {

struct HoldValue {
  Pid pid = 0;
  std::string start;   // the holder's start time
  std::string secret;  // 32 hex digits
  std::string lock_id;
  std::string dir;       // absolute
  std::string etcd_key;  // with --etcd; else empty
};

// "PID:START:SECRET:LOCK_ID:DIR[:ETCD_KEY]", DIR and the key percent-encoded
// (every byte but letters, digits and "/._-"), so that the value is one
// line of printable ASCII for any name.
std::string format_hold_value(const HoldValue& v);
std::optional<HoldValue> parse_hold_value(std::string_view text);

// 128 random bits as 32 hex digits (getrandom(2)); nullopt when the system
// gives none.
std::optional<std::string> new_hold_secret();

// Whether the hold `v` holds the lock file `lock_file` of DIR (open as
// `dirfd`): `live`, or why not, in words that follow "the hold ... ".
struct HoldCheck {
  bool live = false;
  bool unreadable = false;  // the record cannot be read (permissions): nothing could be told
  std::string why;
  std::optional<HolderRecord> record;  // the record, as read
};
HoldCheck check_hold(const HoldValue& v, int dirfd, const sys::FileStatus& lock_file);

// The hold's end as its incident rows tell it, when it ended by --max-time
// (124) or a lost lease (76): the newest such row of the process `pid` with
// `start` and the secret's hash; nullopt when there is none.
std::optional<int> hold_ended_by(int dirfd, Pid pid, const std::string& start, const std::string& secret_sha256);

}  // namespace looplock
