#include "local/local_lock.hpp"

#include <algorithm>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "local/wait_line.hpp"
#include "os/clock.hpp"
#include "os/file_status.hpp"
#include "os/files.hpp"
#include "os/hold_process.hpp"
#include "os/ids.hpp"
#include "os/lock_holders.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "os/wait_status.hpp"
#include "records/coalesce.hpp"
#include "records/hold.hpp"
#include "records/holders.hpp"
#include "records/ledger.hpp"
#include "records/survey.hpp"

namespace looplock {

namespace {

// How long a process that is ending may take to close the lock descriptor
// before it counts as keeping the lock.
constexpr Duration kEndingGrace = std::chrono::milliseconds(200);
// The wait's status line on a terminal: drawn once the wait has lasted this
// long, and redrawn at most this often.
constexpr Duration kRedraw = std::chrono::seconds(1);

std::string lock_display(const std::string& dir) { return sys::path_in_dir(dir, kLockName); }

// The holders as hints for a later look (the kernel's locks, as found).
std::vector<sys::KernelLock> as_hint(const LockFacts& f) {
  std::vector<sys::KernelLock> out;
  for (const auto& h : f.holders) {
    if (!h.exited) out.push_back({h.pid, h.exclusive, h.locked_by});
  }
  return out;
}

// Reports the wait: with -v once (naming the holder); on a terminal a status
// line rewritten in place at most once a second (how long so far, how long
// is left, whom it waits for), erased when the wait ends. For a wait that may
// time out, it also notes who holds the lock when the wait starts, so that
// the timeout's report only has to confirm it (cheaply) instead of reading
// /proc/locks after the deadline.
class WaitReporter : public AcquireObserver {
public:
  WaitReporter(const LockRequest& request, const Logger& log, const WaitPlan& plan, Instant start, std::string shown,
               std::vector<sys::KernelLock>& holders_at_start, bool& said_waiting)
      : request_(request),
        log_(log),
        plan_(plan),
        start_(start),
        shown_(std::move(shown)),
        holders_at_start_(holders_at_start),
        said_waiting_(said_waiting) {}

  void on_wait(const LockFile& file) override {
    wait_started_ = MonotonicClock::now();
    // Asked only once there is a wait to show (isatty(3): an ioctl).
    status_line_ = !log_.is_quiet() && log_.is_text() && sys::is_terminal(log_.fd());
    if (!log_.is_verbose() && plan_.kind != WaitPlan::Kind::Bounded && !status_line_) return;
    const LockFacts facts = survey_held(file, shown_);
    holders_at_start_ = as_hint(facts);
    who_ = holder_phrase(judge(facts));
    if (said_waiting_) return;  // a second wait of the run (for the slot's run): said already
    said_waiting_ = true;
    log_.verbose("waiting", "waiting for " + who_ + " on " + shown_, {{"policy", policy_name(request_.policy)}});
  }
  void on_replaced(int count, bool dir_moved) override {
    log_.warn("lock_file_replaced",
              dir_moved ? request_.dir +
                              " was moved, deleted or replaced while looplock waited for its lock; locking the "
                              "lock file of the directory now at that path (never move a loop's directory "
                              "while it runs)"
                        : shown_ +
                              " was deleted or replaced while looplock waited for it; locking the new file"
                              " (never delete the lock file)",
              {{"count", count}});
  }

  Duration tick_interval() const override { return status_line_ ? kRedraw / 4 : Duration::zero(); }
  void on_tick() override {
    const Instant now = MonotonicClock::now();
    if (now - wait_started_ < kRedraw || (drawn_ && now - last_draw_ < kRedraw)) return;
    last_draw_ = now;
    std::optional<Duration> left;
    if (plan_.kind == WaitPlan::Kind::Bounded) left = later(start_, plan_.timeout) - now;
    const auto columns = sys::terminal_width(log_.fd());
    const size_t width = columns && *columns > 1 ? static_cast<size_t>(*columns - 1) : 79u;
    const std::string line = wait_status_line(now - wait_started_, left, printable(who_), printable(shown_), width);
    (void)sys::write_all(log_.fd(), "\r" + line + "\x1b[K");
    drawn_ = true;
  }
  void on_wait_end() override {
    if (drawn_) (void)sys::write_all(log_.fd(), "\r\x1b[K");
    drawn_ = false;
  }

private:
  const LockRequest& request_;
  const Logger& log_;
  const WaitPlan& plan_;
  Instant start_;
  std::string shown_;
  std::vector<sys::KernelLock>& holders_at_start_;
  bool& said_waiting_;  // the run's "waiting" line was written (by an earlier wait of the run)
  bool status_line_ = false;
  std::string who_ = "another process";
  Instant wait_started_;
  Instant last_draw_;
  bool drawn_ = false;
};

// The descendants of looplock that still hold the lock through the inherited
// descriptor once the job has ended. Those that are ending (exiting in the
// kernel, or in the job's group when looplock sent it a signal: a TERM
// forwarded from timeout(1) takes a moment to act) get up to 200 ms to close
// it; what still holds it then is a leak, named every time. Only a run that
// finds a holder here pays the wait.
std::vector<Pid> leaked_holders(Pid self, const sys::FileStatus& file, const JobEnd& job) {
  std::vector<Pid> leaked = sys::holding_lock(sys::descendants(self), file);
  const Instant until = MonotonicClock::now() + kEndingGrace;
  while (!leaked.empty() && MonotonicClock::now() < until) {
    const bool ending = std::any_of(leaked.begin(), leaked.end(),
                                    [&](Pid p) { return sys::process_ending(p, job.signalled ? job.pgid : 0); });
    if (!ending) break;
    nap(std::chrono::milliseconds(5));
    leaked = sys::holding_lock(leaked, file);
  }
  return leaked;
}

}  // namespace

LocalLock::LocalLock(const LockRequest& request, Pid pid, const Logger& log, LockDir& dir, LockTarget target)
    : request_(request),
      pid_(pid),
      log_(log),
      dir_(dir),
      target_(std::move(target)),
      shown_(lock_display(request.dir)),
      ledger_(dir, request.dir, log) {}

Acquisition LocalLock::acquire(const WaitPlan& plan, Instant start) {
  const bool holder = request_.flags.holders > 0;
  const LockMode mode = request_.flags.shared || holder ? LockMode::Shared : LockMode::Exclusive;
  // Work that does not need the lock is done before waiting for it.
  // /proc/self/stat: looplock's start time, which the holder record carries
  // so that a reader can tell this pid from a later process given the same
  // number (read before waiting, not in the critical section).
  if (mode == LockMode::Exclusive || holder) pid_start_ = sys::own_start().value_or("");
  WaitReporter reporter(request_, log_, plan, start, shown_, holders_at_start_, said_waiting_);
  AcquireResult res = request_.policy == Policy::Coalesce ? acquire_coalescing(plan, start, mode, reporter)
                                                          : take(plan, start, mode, reporter);
  file_ = std::move(res.file);
  if (res.status != Acquisition::Acquired) return res.status;
  Json fields{{"lock_id", target_.lock_id}, {"waited_ms", ms_of(res.waited)}};
  if (holder) fields["holder_index"] = index_;
  log_.verbose("acquired",
               (holder ? "holder index " + std::to_string(index_) + " of " + std::to_string(request_.flags.holders) +
                             " and a shared"
                       : std::string(request_.flags.shared ? "shared" : "exclusive")) +
                   " lock on " + shown_ + " acquired after " + format_duration(res.waited),
               fields);
  if (mode == LockMode::Exclusive || holder) write_record();
  return Acquisition::Acquired;
}

AcquireResult LocalLock::take(const WaitPlan& plan, Instant start, LockMode mode, AcquireObserver& reporter) {
  return request_.flags.holders > 0 ? take_as_holder(plan, start, reporter)
                                    : acquire_lock(dir_, plan, mode, reporter, start);
}

namespace {

// A signal that would end looplock came while it waited in a seat.
struct SeatSignal {
  int sig;
};

}  // namespace

// An index first (never holding .state.lock while waiting for one), then
// .state.lock shared, within the same deadline; the index is let go again
// when the shared lock is not had.
AcquireResult LocalLock::take_as_holder(const WaitPlan& plan, Instant start, AcquireObserver& reporter) {
  const int n = request_.flags.holders;
  indexes_held_.clear();  // an earlier attempt's (-p coalesce): closed before this one opens its own
  IndexWait w = take_index(
      dir_, n, plan, start,
      [&] {
        if (said_waiting_ || !log_.is_verbose()) return;
        said_waiting_ = true;
        log_.verbose("waiting",
                     "waiting for one of the " + std::to_string(n) + " holders of " + shown_ +
                         " to let go of its index",
                     {{"policy", policy_name(request_.policy)}, {"max_holders", n}});
      },
      [&] {
        // In a coalescing seat: a signal held back ends the wait (take_in_seat).
        if (!watching_seat_) return;
        if (const int sig = sys::pending_ending_signal()) {
          reporter.on_wait_end();
          throw SeatSignal{sig};
        }
      });
  if (w.status != Acquisition::Acquired) {
    AcquireResult r;
    r.status = w.status;
    r.waited = MonotonicClock::now() - start;
    // Holders that took their index but wait for .state.lock are not in
    // the way: its exclusive holder is (flock(1), a run without --holders),
    // as the kernel shows it (read, never taken).
    r.file = open_lock_file(dir_);
    const auto kernel = live_holders(r.file.st);
    if (std::none_of(kernel.begin(), kernel.end(), [](const sys::KernelLock& k) { return k.exclusive; })) {
      indexes_held_ = std::move(w.held);
    }
    return r;
  }
  index_ = w.index;
  index_file_ = std::move(w.file);
  indexes_held_.clear();
  AcquireResult res = acquire_lock(dir_, plan, LockMode::Shared, reporter, start);
  // DIR replaced while this run waited for .state.lock (acquire_lock took
  // the new one's): the index taken is the old DIR's, so it is taken again.
  if (res.status == Acquisition::Acquired && res.replaced > 0 &&
      !index_intact(dir_, index_, index_file_).value_or(false)) {
    res.file.fd.reset();
    index_file_.fd.reset();
    index_ = -1;
    return take_as_holder(plan, start, reporter);
  }
  if (res.status != Acquisition::Acquired) {
    index_file_.fd.reset();
    index_ = -1;
  }
  return res;
}

int LocalLock::holder_record_fd() const { return request_.flags.holders > 0 ? index_file_.fd.get() : record_fd(file_); }

// This run's record, as of now (the holder record, and the seat's).
HolderRecord LocalLock::this_run(const std::string& pid_start) const {
  return HolderRecord{.lock_id = target_.lock_id,
                      .pid = pid_,
                      .pid_start = pid_start,
                      .agent_id = request_.identity.agent,
                      .operation = request_.identity.operation,
                      .policy = std::string(policy_name(request_.policy)),
                      .acquired_at = sys::utc_now_iso8601(),
                      .released_at = std::nullopt,
                      .no_fork = request_.flags.no_fork,
                      .holders = index_ >= 0 ? request_.flags.holders : 0,
                      .index = std::max(index_, 0),
                      .hold = hold_facts()};
}

// --hold's facts, with the end --max-time gives the hold from now.
std::optional<HoldFacts> LocalLock::hold_facts() const {
  if (!request_.hold) return std::nullopt;
  HoldFacts h = *request_.hold;
  h.ends_at = sys::utc_iso8601(sys::realtime_ms() + h.max_time_ms);
  return h;
}

namespace {

// The wait's observer, as it is, that also looks, at least every 100 ms,
// for a signal that would end looplock (held back meanwhile).
class SeatWatch final : public AcquireObserver {
public:
  explicit SeatWatch(AcquireObserver& inner) : inner_(inner) {}
  void on_wait(const LockFile& file) override { inner_.on_wait(file); }
  void on_replaced(int count, bool dir_moved) override { inner_.on_replaced(count, dir_moved); }
  Duration tick_interval() const override {
    const Duration inner = inner_.tick_interval();
    return inner > Duration::zero() ? std::min(inner, kLook) : kLook;
  }
  void on_tick() override {
    if (const int sig = sys::pending_ending_signal()) {
      inner_.on_wait_end();
      throw SeatSignal{sig};
    }
    if (inner_.tick_interval() > Duration::zero()) inner_.on_tick();  // it keeps its own pace
  }
  void on_wait_end() override { inner_.on_wait_end(); }

private:
  static constexpr Duration kLook = std::chrono::milliseconds(100);
  AcquireObserver& inner_;
};

}  // namespace

// The wait of the run in the seat. The signals that would end looplock are
// held back meanwhile and looked for: one that comes ends the wait as a
// deadline does (TimedOut), so that the run can say what it absorbed, and
// then ends of it (Run: Blocker::ended_by_signal). With --holders, the
// wait for an index looks for it each time it looks again.
AcquireResult LocalLock::take_in_seat(const WaitPlan& plan, Instant start, LockMode mode, AcquireObserver& reporter) {
  if (!sys::hold_ending_signals()) return take(plan, start, mode, reporter);
  SeatWatch watch(reporter);
  watching_seat_ = true;
  struct Unwatch {
    bool& flag;
    ~Unwatch() { flag = false; }
  } unwatch{watching_seat_};
  try {
    AcquireResult res = take(plan, start, mode, watch);
    if (!sys::pending_ending_signal()) {
      sys::let_ending_signals_through();
      return res;
    }
    // It came as the wait ended (held or not): as if it came first, the
    // lock let go, held back until the run has said what it absorbed.
    seat_signal_ = sys::pending_ending_signal();
    if (res.status == Acquisition::Acquired) {
      try {
        res.file.fd.reset();  // let go: the command is never started
        res.file = open_lock_file(dir_);
      } catch (...) {
        sys::let_ending_signals_through();
        throw;
      }
    }
    res.status = Acquisition::TimedOut;
    return res;
  } catch (const SeatSignal& s) {
    seat_signal_ = s.sig;
    AcquireResult r;
    r.status = Acquisition::TimedOut;
    r.waited = MonotonicClock::now() - start;
    try {
      r.file = open_lock_file(dir_);  // the file found held, for who holds it
    } catch (...) {
      sys::let_ending_signals_through();
      throw;
    }
    return r;
  } catch (...) {
    sys::let_ending_signals_through();
    throw;
  }
}

// A free lock is taken at once; a held one is waited for by one run of the
// operation, the one in its seat, which absorbs every later run of it that
// comes while it waits: those skip (Coalesced). The seat is left once the
// wait has ended, held or not.
AcquireResult LocalLock::acquire_coalescing(const WaitPlan& plan, Instant start, LockMode mode,
                                            AcquireObserver& reporter) {
  AcquireObserver quiet;
  AcquireResult first = take({WaitPlan::Kind::NoWait, Duration::zero()}, start, mode, quiet);
  if (first.status == Acquisition::Acquired) return first;
  const std::string pid_start = pid_start_.empty() ? sys::own_start().value_or("") : pid_start_;
  const HolderRecord me = this_run(pid_start);
  Seat seat = take_seat(dir_, me, mode == LockMode::Shared);
  if (seat.unavailable) {
    log_.warn("coalesce_unavailable", "-p coalesce cannot take the seat of " + clip_bytes(request_.identity.operation) + " (" +
                                          *seat.unavailable +
                                          "); this run waits for the lock without absorbing later runs");
    return take(plan, start, mode, reporter);
  }
  if (!seat.taken()) {
    seat_waiter_ = seat.waiter;
    if (!absorb(dir_, seat, pid_, pid_start, request_.start_wall_ms)) {
      log_.warn("absorb_unrecorded",
                errno_message("cannot note this run in -p coalesce's seat " + seat.name, errno) +
                    ": the run that waits does its work, but will not count it");
    }
    first.status = Acquisition::Coalesced;
    return first;
  }
  if (seat.record_err != 0) {
    log_.warn("coalesce_unavailable",
              errno_message("cannot write this run's record into -p coalesce's seat " + seat.name, seat.record_err) +
                  ": later runs of " + clip_bytes(request_.identity.operation) +
                  " are still absorbed by this run, without naming it");
  }
  if (seat.dead_waiter) {
    log_.warn("coalesced",
              "pid " + std::to_string(seat.dead_waiter->pid) + " died in the seat of " +
                  clip_bytes(request_.identity.operation) + " (KILLed while it waited) after it absorbed " +
                  std::to_string(seat.inherited) + " later run" + (seat.inherited == 1 ? "" : "s") +
                  ", which never ran: this run runs for them",
              {{"coalesced", seat.inherited}, {"dead_waiter", holder_to_json(*seat.dead_waiter)}});
  }
  AcquireResult res = take_in_seat(plan, start, mode, reporter);
  const Absorbed absorbed = leave_seat(seat, me);
  absorbed_ = absorbed.count;
  absorbed_start_ms_ = absorbed.newest_started_ms;
  if (res.status == Acquisition::Acquired && *absorbed_ > 0) {
    log_.verbose("coalesced",
                 "this run absorbed " + std::to_string(*absorbed_) + " later run" + (*absorbed_ == 1 ? "" : "s") +
                     " of " + clip_bytes(request_.identity.operation) + " while it waited",
                 {{"coalesced", *absorbed_}});
  }
  return res;
}

// Held: record who holds it (--holders: in its index file).
void LocalLock::write_record() {
  const bool holder = request_.flags.holders > 0;
  const LockFile& file = holder ? index_file_ : file_;
  const std::string shown = holder ? sys::path_in_dir(request_.dir, index_name(index_)) : shown_;
  // Where the record has a file of its own (Windows), the lock file's access
  // does not matter: that file's does (record_fd() says why it failed).
  if (file.read_only && (holder || !record_beside_lock())) {
    if (request_.hold) {
      throw Fatal(exit_code::kOsError,
                  "a hold needs its holder record, and " + shown + " is read-only for looplock; the lock was let go",
                  "Later steps confirm the hold by that record: make the lock file writable for this user.");
    }
    log_.warn(
        "read_only_lock_file",
        shown + " is read-only for looplock: the lock is held, but no holder record can be written (" +
            (file.read_only_err == EROFS        ? std::string("its file system is read-only")
             : file.st.owner == sys::own_euid() ? std::string("chmod u+w it")
                                                : "its owner, uid " + std::to_string(file.st.owner) +
                                                      ", or root makes it group-writable for a group: chmod g+w") +
            ")");
    return;
  }
  record_ = this_run(pid_start_);
  if (!write_holder(holder_record_fd(), *record_)) {
    if (request_.hold) fail_errno(exit_code::kOsError, "cannot write the hold's holder record into " + shown, errno);
    log_.warn("holder_write_failed",
              errno_message("cannot write the holder record into " +
                                (!holder && record_beside_lock() ? sys::path_in_dir(request_.dir, kHolderName) : shown),
                            errno));
    record_.reset();
  }
}

namespace {

// What the row and the line say of the holders: the verdict's.
HolderFacts holder_facts(const Verdict& v) {
  HolderFacts f;
  for (const auto& h : v.holders) f.pids.push_back(h.pid);
  if (v.record == RecordState::Current) {
    f.holder = v.read;
    f.holder_alive = v.read_alive;
  }
  f.record_status = record_state_name(v.record);
  if (v.read && v.record != RecordState::Current) f.record = v.read;
  f.warnings = v.warnings;
  return f;
}

}  // namespace

// --holders: who holds each index (its record, when the kernel confirms
// it), the first of them as the holder.
Blocker LocalLock::indexes_blocker(const std::vector<LockFile>& files, const std::vector<int>& indexes) const {
  Blocker b;
  b.inspect_hint = "looplock --inspect " + shell_word(request_.dir);
  b.fields["holders"] = Json::array();
  std::vector<std::string> whos;
  std::vector<Pid> confirm;
  const std::string host = sys::host_name();
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string name = index_name(indexes[i]);
    const Verdict v = judge(survey_held(files[i], sys::path_in_dir(request_.dir, name)));
    Json one{{"index", indexes[i]}, {"holder_pids", Json::array()}, {"holder", nullptr}};
    for (const auto& h : v.holders) {
      one["holder_pids"].push_back(h.pid);
      b.holders.pids.push_back(h.pid);
      b.holder_ids.push_back({.host = host, .pid = h.pid, .pid_start = h.start.value_or("")});
    }
    if (v.record == RecordState::Current && v.read) {
      one["holder"] = holder_to_json(*v.read);
      if (!b.holders.holder) {
        b.holders.holder = v.read;
        b.holders.holder_alive = v.read_alive;
        b.holders.record_status = record_state_name(v.record);
      }
    }
    b.fields["holders"].push_back(one);
    if (whos.size() < 3) whos.push_back(holder_phrase(v));
    confirm.insert(confirm.end(), v.confirm.begin(), v.confirm.end());
  }
  b.who = join(whos, "; ") + (files.size() > whos.size()
                                  ? " and " + std::to_string(files.size() - whos.size()) + " more"
                                  : std::string());
  if (!confirm.empty()) {
    b.confirm = pids_text(confirm);
    b.many = confirm.size() > 1;
  }
  return b;
}

namespace {

// The --holders index files of DIR that are held now, opened for reading
// only (never created or locked; a FIFO or device never opened), with
// their indexes.
std::pair<std::vector<LockFile>, std::vector<int>> held_index_files(const LockDir& dir) {
  std::pair<std::vector<LockFile>, std::vector<int>> out;
  for (const int k : indexes_in(dir)) {
    auto file = open_index_to_read(dir, k);
    if (!file || live_holders(file->st).empty()) continue;
    out.first.push_back(std::move(*file));
    out.second.push_back(k);
  }
  return out;
}

}  // namespace

Blocker LocalLock::blocker() const {
  Blocker b;
  if (!indexes_held_.empty()) {
    std::vector<int> all(indexes_held_.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    b = indexes_blocker(indexes_held_, all);
    b.what = "every holder index of " + shown_ + " (--holders " + std::to_string(request_.flags.holders) + ")";
    b.frees_when = "one of the holder indexes of " + shown_ + " (--holders " + std::to_string(request_.flags.holders) +
                   ") is free";
  } else {
    b = lock_blocker();
    // Held shared without a record: by --holders holders? Each wrote its
    // record in its index file, which names it.
    const auto kernel = b.holders.holder || b.holders.pids.empty() ? std::vector<sys::KernelLock>()
                                                                    : live_holders(file_.st);
    if (!kernel.empty() && std::none_of(kernel.begin(), kernel.end(), [](const auto& k) { return k.exclusive; })) {
      const auto [files, indexes] = held_index_files(dir_);
      if (!files.empty()) {
        Blocker by = indexes_blocker(files, indexes);
        by.what = b.what;
        by.fields.update(b.fields, /*merge_objects=*/true);
        b = std::move(by);
      }
    }
  }
  if (absorbed_) b.fields["coalesced"] = *absorbed_;
  b.ended_by_signal = seat_signal_;
  if (seat_waiter_) {
    b.waiting = "pid " + std::to_string(seat_waiter_->pid) + " (agent " + printable(seat_waiter_->agent_id) +
                ", waiting since " + seat_waiter_->acquired_at + ")";
    b.fields["coalesce"] = Json{{"waiter", holder_to_json(*seat_waiter_)}};
  }
  return b;
}

Blocker LocalLock::lock_blocker() const {
  Blocker b;
  b.what = shown_;
  const Verdict v = judge(survey_held(file_, b.what, holders_at_start_));
  b.who = holder_phrase(v);
  b.inspect_hint = "looplock --inspect " + shell_word(request_.dir);
  b.holders = holder_facts(v);
  const std::string host = sys::host_name();
  for (const auto& h : v.holders) {
    b.holder_ids.push_back({.host = host, .pid = h.pid, .pid_start = h.start.value_or("")});
  }
  if (v.record == RecordState::Current && v.read) {
    b.holder_ids.push_back({.host = host, .pid = v.read->pid, .pid_start = v.read->pid_start});
  }
  if (!v.confirm.empty()) {
    b.confirm = pids_text(v.confirm);
    b.many = v.confirm.size() > 1;
  }
  return b;
}

void LocalLock::prepare(CommandSpec& spec) {
  env_set(spec.env,
          {{env_name::kDir, target_.canonical_dir},
           {env_name::kLockId, target_.lock_id},
           {env_name::kPolicy, std::string(policy_name(request_.policy))},
           {env_name::kHolderPid, std::to_string(pid_)}},
          {env_name::kFd, env_name::kHolderFd, env_name::kHolderIndex, env_name::kEtcdPassword});
}

void LocalLock::export_to(CommandSpec& spec) {
  const std::string fd = std::to_string(file_.fd.get());
  spec.env.push_back(std::string(env_name::kHolderFd) + "=" + fd);
  if (index_ >= 0) spec.env.push_back(std::string(env_name::kHolderIndex) + "=" + std::to_string(index_));
  if (!request_.flags.close_fd) spec.env.push_back(std::string(env_name::kFd) + "=" + fd);
  spec.pass_fd = request_.flags.close_fd ? -1 : file_.fd.get();
  // --holders: the index goes with the lock, so that what the job leaves
  // behind holding the lock holds its index too (never N+1 at once).
  if (index_ >= 0 && !request_.flags.close_fd) spec.also_pass_fd = index_file_.fd.get();
}

void LocalLock::release(Ending& ending) {
  // The command has ended; looplock still holds the lock. Was it protecting
  // the real file all along?
  const auto check = lock_intact(dir_, file_);
  if (const auto* f = std::get_if<sys::Failure>(&check)) {
    log_.warn("intact_unknown",
              errno_message("cannot check whether " + shown_ + " is still the file that was locked", f->err) +
                  "; not reporting it as vanished");
  }
  ending.intact = !std::holds_alternative<bool>(check) || std::get<bool>(check);
  if (index_ >= 0 && ending.intact && !index_intact(dir_, index_, index_file_).value_or(true)) {
    log_.warn("holder_index_replaced",
              sys::path_in_dir(request_.dir, index_name(index_)) +
                  " was deleted or replaced while the command ran: another run could take the same index meanwhile, "
                  "so more than " +
                  std::to_string(request_.flags.holders) + " may have held the lock (never delete the index files)");
  }
  const bool holder = request_.flags.holders > 0;
  if (record_ && ending.intact) {
    record_->released_at = sys::utc_now_iso8601();
    if (!write_holder(holder_record_fd(), *record_)) {
      log_.warn("holder_write_failed",
                errno_message("cannot write the release into " +
                                  (holder                 ? sys::path_in_dir(request_.dir, index_name(index_))
                                   : record_beside_lock() ? sys::path_in_dir(request_.dir, kHolderName)
                                                          : shown_),
                              errno));
    }
  }
  ending.record = record_;
  file_.fd.reset();  // release
  index_file_.fd.reset();  // --holders: then the index, so that never more than N hold .state.lock
  // After the release, so that the next holder does not wait for it: one
  // read of /proc/PID/task/PID/children when the job left no process.
  if (!request_.flags.close_fd) ending.leaked = report_leaks(ending.job) || ending.leaked;
  const int status = ending.job.status;
  const auto end = sys::ending_of(status);
  log_.verbose("released",
               "released " + shown_ + "; the command " +
                   (end && end->by_signal ? "was killed by signal " + std::to_string(end->value)
                                          : "exited with " + std::to_string(shell_status(status))),
               {{"lock_id", target_.lock_id},
                {"exit_status", shell_status(status)},
                {"ran_ms", ms_of(ending.job.ended - ending.job.started)}});
  if (!ending.intact) {
    const bool command_failed = !(end && !end->by_signal && end->value == 0);
    log_.error("loop_dir_vanished",
               "loop dir vanished mid-lock: " + shown_ +
                   " was deleted or replaced while the command ran, so the lock no longer protected it",
               command_failed ? "The command failed too; looplock exits with its status."
                              : "Check what removed it; never delete the lock file or the loop directory of a running "
                                "loop.");
  }
}

// A process the command started may still hold the inherited lock fd: then
// the lock stays held after looplock exits. (Checked after the release, so
// that the next holder does not wait for it.)
bool LocalLock::report_leaks(const JobEnd& job) const {
  auto leaked = leaked_holders(pid_, file_.st, job);
  // --holders: a process that closed $LOOPLOCK_FD may still keep the index.
  const bool index_only = leaked.empty() && index_ >= 0;
  if (index_only) leaked = leaked_holders(pid_, index_file_.st, job);
  if (leaked.empty()) return false;
  if (index_only) {
    const bool many = leaked.size() > 1;
    log_.warn_always("lock_leaked",
                     "the command exited, but " + pids_text(leaked) + " that it started still " +
                         (many ? "hold " : "holds ") + sys::path_in_dir(request_.dir, index_name(index_)) +
                         " through the inherited descriptor: that index stays taken (one holder fewer) until " +
                         (many ? "they exit" : "it exits") +
                         ". Use -o/--close for commands that start background "
                         "processes",
                     {{"pids", leaked}});
    return true;
  }
  const bool many = leaked.size() > 1;
  log_.warn_always(
      "lock_leaked",
      "the command exited, but " + pids_text(leaked) + " that it started still " + (many ? "hold " : "holds ") +
          shown_ + " through the inherited lock fd; the lock stays held until " + (many ? "they exit" : "it exits") +
          ". Use -o/--close for commands that start background processes",
      {{"pids", leaked}});
  return true;
}

void LocalLock::abandon() {
  if (!record_) return;
  record_->released_at = sys::utc_now_iso8601();
  (void)write_holder(holder_record_fd(), *record_);
}

// --- the local run ledger (--once-per) --------------------------------------------

namespace {

std::string local_ledger_name(const std::string& dir) { return "run ledger " + sys::path_in_dir(dir, kRunsName); }

// Records `entry`; says when the ledger holds more operations inside their
// slots than kMaxLedgerOperations (it grows), or had to drop some.
void record_locally(const LockDir& dir, const RunEntry& entry, OwnCopies& own, const Logger& log) {
  const LedgerUpdate u = record_local_ledger(dir, entry, sys::realtime_ms(), own);
  if (u.dropped_in_slot > 0) {
    log.warn("ledger_crowded",
             local_ledger_name(dir.path) + " holds " + std::to_string(kMaxLedgerEntries) +
                 " operations inside their --once-per slots, its most: the oldest " +
                 std::to_string(u.dropped_in_slot) + " were dropped, and may run again within their slot",
             {{"entries", kMaxLedgerEntries}, {"dropped", u.dropped_in_slot}});
  } else if (u.crowded > 0) {
    log.warn("ledger_crowded",
             local_ledger_name(dir.path) + " holds " + std::to_string(u.crowded) +
                 " operations inside their --once-per slots, more than " + std::to_string(kMaxLedgerOperations) +
                 ": it grows (up to " + std::to_string(kMaxLedgerEntries) +
                 "); are operation names made per run (a date, a job id)?",
             {{"entries", u.crowded}, {"dropped", 0}});
  }
}

bool record_end_locally(const LockDir& dir, const RunEntry& entry, OwnCopies& own, const Logger& log) {
  try {
    (void)record_local_ledger(dir, entry, sys::realtime_ms(), own);  // a crowded ledger was said at the start
    return true;
  } catch (const Fatal& f) {
    log.warn("ledger_write_failed", std::string(f.what()) +
                                        "; this run's end is not recorded, so its slot may run "
                                        "again");
    return false;
  }
}

}  // namespace

LedgerLook LocalLedger::look(const std::string& operation, bool locked) {
  if (locked && !guard_) guard_ = guard_ledger(dir_);
  return look_local_ledger(dir_, operation);
}
void LocalLedger::record_start(const RunEntry& entry) {
  if (!guard_) guard_ = guard_ledger(dir_);
  record_locally(dir_, entry, own_, log_);
  guard_.reset();
}
bool LocalLedger::record_end(const RunEntry& entry) {
  const UniqueFd guard = guard_ledger(dir_);
  return record_end_locally(dir_, entry, own_, log_);
}
std::string LocalLedger::name() const { return local_ledger_name(shown_); }

// --- nested -------------------------------------------------------------------

namespace {

// Whether DIR/.state.lock is held, and only shared: an exclusive attempt
// on a fresh open file fails and a shared one succeeds (closing undoes it).
bool held_shared_only(const LockDir& dir) {
  const UniqueFd fresh = sys::open_in(dir.fd.get(), kLockName, {.access = sys::OpenIn::Access::Read});
  if (!fresh || sys::try_lock(fresh.get(), /*exclusive=*/true)) return false;
  return sys::try_lock(fresh.get(), /*exclusive=*/false);
}

}  // namespace

std::optional<OuterHolder> outer_holder(const LockRequest& request, const EnvList& env, const LockDir& dir, Pid self,
                                        sys::FileStatus& lock_file) {
  if (!env_get(env, env_name::kHolderFd) || !sys::status_at(dir.fd.get(), kLockName, lock_file) ||
      !lock_file.regular()) {
    return std::nullopt;
  }
  const bool exclusive = !request.flags.shared && request.flags.holders == 0;
  auto outer = find_outer_holder(env, dir.fd.get(), lock_file, exclusive, self);
  if (!outer && request.flags.holders > 0 && env_get(env, env_name::kHolderIndex) &&
      inherited_lock_fd(env, lock_file)) {
    // Inside a holder of this very lock (its descriptor is inherited) that
    // cannot be confirmed (no /proc): taking an index of its own could
    // wait for the holders this run is part of.
    throw Fatal(request.conflict_exit_code,
                "cannot tell whether this command runs inside holder " + *env_get(env, env_name::kHolderIndex) +
                    " of " + lock_display(request.dir) +
                    " (this system shows no /proc to confirm it), so it does "
                    "not take an index of its own, which could wait for its own holder",
                "Run it without looplock there (its parent holds the lock already), or mount /proc.",
                "nested_in_shared");
  }
  if (outer || !exclusive) return outer;
  // Inside a run that holds it shared (--holders, -s): an exclusive lock
  // would wait for this run's own ancestor until the deadline, or forever.
  std::optional<OuterHolder> shared = find_outer_holder(env, dir.fd.get(), lock_file, /*exclusive=*/false, self);
  // Without /proc that cannot be confirmed: a descriptor on this very lock
  // file was inherited, and the lock is held shared only (a probe that
  // takes and drops it): its holder is this run's ancestor.
  if (const auto fd = inherited_lock_fd(env, lock_file);
      !shared && fd && !sys::own_fd_holds_lock(*fd, lock_file, false)) {
    if (held_shared_only(dir)) shared = OuterHolder{.pid = 0, .fd = *fd, .inherited = true};
  }
  if (shared) {
    const auto index = env_get(env, env_name::kHolderIndex);
    throw Fatal(request.conflict_exit_code,
                "cannot take " + lock_display(request.dir) + " exclusively: this command runs inside " +
                    (index ? "holder " + *index + " of looplock --holders" : std::string("looplock -s")) +
                    (shared->pid != 0 ? " (pid " + std::to_string(shared->pid) + ")" : std::string()) +
                    ", which holds it shared, so the lock would wait for its own holder",
                "Run the step that needs the lock alone outside that run, or run it here under the same lock "
                "(--holders N, or -s).",
                "nested_in_shared");
  }
  return std::nullopt;
}

std::optional<OuterHolder> hold_holder(const EnvList& env, const LockDir& dir, const LockTarget& target,
                                       const Logger& log, sys::FileStatus& lock_file, std::string& etcd_key) {
  const std::optional<std::string> text = env_get(env, env_name::kHold);
  if (!text || text->empty()) return std::nullopt;
  const std::optional<HoldValue> v = parse_hold_value(*text);
  if (!v) {
    log.warn("hold_value_invalid", "ignoring $LOOPLOCK_HOLD: it is not a value looplock --hold printed");
    return std::nullopt;
  }
  if (v->lock_id != target.lock_id) return std::nullopt;  // another lock's hold
  if (!sys::status_at(dir.fd.get(), kLockName, lock_file) || !lock_file.regular()) return std::nullopt;
  const HoldCheck c = check_hold(*v, dir.fd.get(), lock_file);
  if (!c.live) {
    log.warn("hold_not_live", "$LOOPLOCK_HOLD names a hold of " + lock_display(dir.path) + " that " + c.why +
                                  "; this run waits for the lock as any run does");
    return std::nullopt;
  }
  etcd_key = v->etcd_key;
  // The hold's own descriptor, from its sentinel: the command then holds
  // the lock through it, as under any looplock (a loop script's own lock
  // nests instead of waiting for the hold).
  sys::HoldShare share = sys::fetch_hold_fd(v->pid, v->start, v->secret);
  UniqueFd& fd = share.fd;
  if (fd && !holds_through(fd.get(), dir.fd.get(), lock_file, /*exclusive=*/true)) {
    fd.reset();
    errno = EPROTO;
  }
  if (!fd) {
    // Only the descriptor proves the lock is held for this run: the hold
    // may have ended since it was confirmed.
    log.warn("hold_fd_unavailable", errno_message("the hold did not hand over its lock descriptor", errno) +
                                        "; this run waits for the lock as any run does");
    return std::nullopt;
  }
  // The cluster lock's key, lease and token, for the command: those names only.
  std::vector<std::pair<std::string_view, std::string>> exports;
  sys::for_each_line(share.exports, [&](std::string_view line) {
    for (const auto name : {env_name::kEtcdKey, env_name::kEtcdLease, env_name::kFencingToken}) {
      if (line.starts_with(std::string(name) + "=")) exports.emplace_back(name, line.substr(name.size() + 1));
    }
  });
  return OuterHolder{.pid = v->pid,
                     .fd = fd.release(),
                     .inherited = true,
                     .hold = true,
                     .exports = exports,
                     .hold_ends_at = c.record && c.record->hold ? c.record->hold->ends_at : std::string(),
                     // Kept open until this looplock exits (close-on-exec): while it is, the
                     // hold's end leaves the hold's lease to this run (hold_process.hpp).
                     .hold_conn = share.conn.release()};
}

InheritedLock::InheritedLock(const LockRequest& request, const Logger& log, const LockDir& dir,
                             const OuterHolder& outer, const sys::FileStatus& lock_file, const LockTarget& target,
                             Pid self)
    : request_(request),
      log_(log),
      dir_(dir),
      outer_(outer),
      lock_file_(lock_file),
      target_(target),
      self_(self),
      ledger_(dir, request.dir, log) {
  if (!request_.once_per) return;
  // Which operation's slot the outer holder runs: its record says.
  const UniqueFd fd = sys::open_in(dir.fd.get(), record_name(), {.access = sys::OpenIn::Access::Read});
  if (!fd) return;
  const HolderRead read = read_holder(fd.get());
  outer_operation_ =
      read.record && !read.record->released_at && read.record->operation == clip_bytes(request_.identity.operation);
}

// No open, so no ownership check: the outer looplock made it; the command may
// run as another user, under su or runuser, with the descriptor kept.
Acquisition InheritedLock::acquire(const WaitPlan& /*plan*/, Instant /*start*/) {
  log_.verbose("nested",
               std::string("already held ") +
                   (outer_.hold ? "by the hold $LOOPLOCK_HOLD names (looplock pid " + std::to_string(outer_.pid) + ")"
                    : outer_.inherited ? "through the lock descriptor this run inherited"
                                       : "by looplock pid " + std::to_string(outer_.pid) + " (an ancestor)") +
                   "; running inside its critical section");
  return Acquisition::Acquired;
}

void InheritedLock::export_to(CommandSpec& spec) {
  if (outer_.hold) {
    // A later step of a hold: nothing is inherited from it but its value.
    // This looplock keeps the hold's descriptor while the command runs, so
    // it is the holder the command's processes nest under, as under any
    // looplock (also those the descriptor does not reach: -o, a child
    // started without it).
    env_set(spec.env, {{env_name::kDir, target_.canonical_dir},
                       {env_name::kLockId, target_.lock_id},
                       {env_name::kPolicy, std::string(policy_name(request_.policy))}});
    env_set(spec.env, outer_.exports);
    // The hold's --max-time ends its steps too: at the hold's end, as a
    // run's own --max-time would (TERM, then KILL after --kill-after).
    if (const auto ends = sys::parse_utc_ms(outer_.hold_ends_at)) {
      const Duration left = of_ms(std::max(*ends - sys::realtime_ms(), 1LL));
      if (!spec.limits.max_time || left < *spec.limits.max_time) {
        spec.limits.max_time = left;
        spec.limits.max_time_from = "the hold's --max-time (its end at " + outer_.hold_ends_at + ")";
        if (!spec.limits.max_time_kill_after) spec.limits.max_time_kill_after = kDefaultKillAfter;
      }
    }
    // The hold's tie ends a running step too, as its --max-time does.
    if (outer_.hold_conn >= 0) spec.outer_ended = [conn = outer_.hold_conn] { return sys::hold_tie_ended(conn); };
    if (outer_.fd < 0) return;
    env_set(spec.env,
            {{env_name::kHolderPid, std::to_string(self_)}, {env_name::kHolderFd, std::to_string(outer_.fd)}});
    if (request_.flags.close_fd) return;
    env_set(spec.env, {{env_name::kFd, std::to_string(outer_.fd)}});
    spec.pass_fd = outer_.fd;
    return;
  }
  if (!request_.flags.close_fd) return;
  // -o holds inside a nested run too: the command gets no lock fd.
  if (auto fd = inherited_lock_fd(spec.env, lock_file_); fd && !sys::keep_from_commands(*fd)) {
    fail_errno(exit_code::kOsError, "cannot keep the lock descriptor from the command (-o)", errno);
  }
  env_set(spec.env, {}, {env_name::kFd});
}

}  // namespace looplock
