// The cluster lock without a network: ClusterLock against a small in-memory
// etcd on a fake clock (the queue, renewals, the lease's deadlines, riding
// out outages, names and their keys), so that the deadline arithmetic is
// checked exactly and without waiting; the lease timing against the man
// page's table. The whole against a real etcd: tests/integration/test_etcd*.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "base/error.hpp"
#include "cluster/cluster.hpp"
#include "cluster/etcd.hpp"
#include "fake_etcd.hpp"
#include "lock/lock.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/verdict.hpp"

using namespace looplock;
using namespace looplock::etcd;

// Lease timing in nanoseconds, as the rows count it.
namespace timing_ns {
long long ttl_ns(int ttl_s) { return lease_timing::ttl(ttl_s).count(); }
long long margin_ns(int ttl_s) { return lease_timing::margin(ttl_s).count(); }
long long min_renewal_ns(int ttl_s) { return lease_timing::min_renewal(ttl_s).count(); }
long long waiter_renewal_ns(int ttl_s) { return lease_timing::waiter_renewal(ttl_s).count(); }
long long holder_renewal_ns(int ttl_s, long long ka) {
  return lease_timing::holder_renewal(ttl_s, Duration(ka)).count();
}
long long outage_ridden_ns(int ttl_s, long long ka) { return lease_timing::outage_ridden(ttl_s, Duration(ka)).count(); }
long long attempt_ns(int ttl_s) { return lease_timing::attempt(ttl_s).count(); }
long long default_kill_after_ns(int ttl_s) { return lease_timing::default_kill_after(ttl_s).count(); }
long long max_kill_after_ns(int ttl_s) { return lease_timing::max_kill_after(ttl_s).count(); }
constexpr long long kRideOutNs = lease_timing::kRideOut.count();
}  // namespace timing_ns

namespace {
// A contender's holder value (agent x, operation y, acquired at T).
ClusterHolder holder(std::string host, long long pid, std::string lease) {
  ClusterHolder h;
  h.host = std::move(host);
  h.pid = pid;
  h.agent_id = "x";
  h.operation = "y";
  h.acquired_at = "T";
  h.lease = std::move(lease);
  return h;
}
}  // namespace

TEST_CASE("cluster lock name: --lock-name, else DIR's base name, '/' for the root") {
  CHECK(cluster_lock_name("", "") == "/");  // DIR=/ (its canonical path without the trailing '/')
  CHECK(cluster_lock_name("", "/srv/loops/nightly") == "nightly");
  CHECK(cluster_lock_name("given", "/srv/loops/nightly") == "given");
  CHECK(cluster_lock_name("given", "") == "given");
  CHECK(cluster_lock_name("", "/srv/a b") == "a b");
  try {
    cluster_lock_name("", "/srv/bad\nname");
    FAIL("no throw");
  } catch (const Fatal& f) {
    CHECK(f.status() == 64);
    CHECK(std::string(f.hint()).find("--lock-name") != std::string::npos);
    CHECK(std::string(f.what()).ends_with(": a lock name is 1 to 255 bytes without control characters"));
  }
}

namespace {

// looplock-cluster(7)'s lease table: per --ttl, the five numbers in
// seconds: renewal, kill-after, margin, TERM by, outage.
std::map<int, std::vector<double>> man_page_lease_table() {
  std::ifstream in(std::string(LOOPLOCK_SOURCE_ROOT) + "/man/looplock-cluster.7.scd");
  std::stringstream all;
  all << in.rdbuf();
  const std::string man = all.str();
  std::map<int, std::vector<double>> rows;
  size_t at = man.find("[[ *--ttl*");
  if (at == std::string::npos) return rows;
  std::istringstream table(man.substr(at, man.find("\n\n", at) - at));
  std::string line;
  int ttl = 0;
  while (std::getline(table, line)) {
    if (line.starts_with("|  ")) {
      ttl = std::stoi(line.substr(3));
      rows[ttl];
    } else if (line.starts_with(":  ") && ttl != 0) {
      rows[ttl].push_back(std::stod(line.substr(3)));
    }
  }
  return rows;
}

}  // namespace

TEST_CASE("lease timing: looplock-cluster(7)'s table is what the code computes") {
  using namespace timing_ns;
  const auto rows = man_page_lease_table();
  REQUIRE(rows.size() >= 3);  // the table was found and read
  for (const auto& [ttl, numbers] : rows) {
    CAPTURE(ttl);
    REQUIRE(numbers.size() == 6);
    const double s = 1e9;
    const long long ka = default_kill_after_ns(ttl);
    const double expected[] = {
        holder_renewal_ns(ttl, ka) / s,          waiter_renewal_ns(ttl) / s,   ka / s, margin_ns(ttl) / s,
        (ttl_ns(ttl) - ka - margin_ns(ttl)) / s, outage_ridden_ns(ttl, ka) / s};
    for (size_t i = 0; i < 6; ++i) {
      CAPTURE(i);
      CHECK(std::abs(numbers[i] - expected[i]) < 0.01);  // the man page rounds to two decimals
    }
  }
}

TEST_CASE("lease timing: the numbers of looplock-cluster(7)'s text") {
  using namespace timing_ns;
  CHECK(margin_ns(3) == 230 * kMs);
  CHECK(margin_ns(10) == 300 * kMs);
  // A holder renews no more often than riding out 2.5 s needs, at least as
  // often as etcd's own client (a third of the TTL), never more often than a
  // twelfth; a waiter every third.
  CHECK(holder_renewal_ns(3, default_kill_after_ns(3)) == 250 * kMs);  // the floor: 2.5 s does not fit
  CHECK(holder_renewal_ns(5, default_kill_after_ns(5)) == 1'416'666'667LL);
  CHECK(holder_renewal_ns(10, default_kill_after_ns(10)) == 3'333'333'333LL);
  CHECK(holder_renewal_ns(10, max_kill_after_ns(10)) == min_renewal_ns(10));  // a long --kill-after: the floor
  CHECK(waiter_renewal_ns(3) == 1 * kSec);
  CHECK(waiter_renewal_ns(10) == 3'333'333'333LL);
  CHECK(outage_ridden_ns(5, default_kill_after_ns(5)) == timing_ns::kRideOutNs);
  CHECK(outage_ridden_ns(10, default_kill_after_ns(10)) == 4'700'000'001LL);
  CHECK(outage_ridden_ns(10, max_kill_after_ns(10)) == timing_ns::kRideOutNs);
  CHECK(attempt_ns(2) == 250 * kMs);
  CHECK(attempt_ns(3) == 300 * kMs);
  CHECK(attempt_ns(60) == 2 * kSec);
  CHECK(default_kill_after_ns(3) == 500 * kMs);
  CHECK(default_kill_after_ns(10) == 1'666'666'666LL);
  CHECK(default_kill_after_ns(60) == 5 * kSec);
  // At --ttl 3 with the defaults, an outage that begins just before a
  // renewal is due may last this long without TERM: more than a 3-member
  // cluster's leader election (1 to 2 s with etcd's default timeouts).
  CHECK(outage_ridden_ns(3, default_kill_after_ns(3)) == 2020 * kMs);
  CHECK(max_kill_after_ns(3) == 1770 * kMs);
  for (int ttl : {2, 3, 5, 10, 30, 86400}) {
    CAPTURE(ttl);
    CHECK(default_kill_after_ns(ttl) <= max_kill_after_ns(ttl));
    CHECK(max_kill_after_ns(ttl) > 0);
    // Even with the longest --kill-after the lease rides out a quarter of
    // the TTL (what --kill-after's bound promises).
    CHECK(outage_ridden_ns(ttl, max_kill_after_ns(ttl)) >= ttl_ns(ttl) / 4);
    // With the default, 2.5 s where the TTL leaves room for it.
    if (ttl >= 5) CHECK(outage_ridden_ns(ttl, default_kill_after_ns(ttl)) >= timing_ns::kRideOutNs);
  }
}

TEST_CASE("cluster lock: uncontended, two requests; the deadlines count from the grant's sending") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  etcd.answer_ns = 20 * kMs;  // every answer takes 20 ms
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "nightly", 3, std::chrono::milliseconds(600), log, {}, clock);
  const long long t0 = clock.t;
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(etcd.transport.calls.size() == 2);  // grant, then the queue's txn
  CHECK(etcd.transport.calls[1].path == "/v3/kv/txn");
  CHECK(lock.key() == "looplock/nightly/lock/" + lease_hex(lock.lease()));
  CHECK(lock.fencing_token() == etcd.kvs.at(lock.key()).create);
  // The holder value is the key's own value, written by the same transaction.
  auto value = parse_cluster_holder(etcd.kvs.at(lock.key()).value);
  REQUIRE(value);
  CHECK((*value)["pid"] == 42);
  CHECK((*value)["lease"] == lease_hex(lock.lease()));
  // Expiry: when the grant was sent (t0), not when it came back (t0 + 20 ms).
  CHECK(ns_of(lock.expiry()) == t0 + 3 * kSec);
  CHECK(ns_of(lock.kill_by()) == t0 + 3 * kSec - 230 * kMs);
  CHECK(ns_of(lock.term_by()) == t0 + 3 * kSec - 230 * kMs - 600 * kMs);
  CHECK(ns_of(lock.next_renewal()) == t0 + 250 * kMs);
  lock.release();
  CHECK(etcd.transport.calls.back().path == "/v3/lease/revoke");
  CHECK(etcd.kvs.empty());  // revoking the lease deleted the key: one write for the release
  CHECK(etcd.transport.calls.size() == 3);
}

TEST_CASE("cluster lock: a slow keepalive moves the expiry to when it was sent") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  clock.t = ns_of(lock.next_renewal());
  const long long sent = clock.t;
  etcd.answer_ns = 250 * kMs;  // answered, slowly (within the 300 ms attempt)
  REQUIRE(lock.renew(lock.term_by()));
  CHECK(clock.t == sent + 250 * kMs);
  CHECK(ns_of(lock.expiry()) == sent + 3 * kSec);
  CHECK(ns_of(lock.term_by()) == sent + 3 * kSec - 830 * kMs);
  CHECK(ns_of(lock.next_renewal()) == sent + 250 * kMs);
}

TEST_CASE("cluster lock: renew fails over within its bound and returns by it") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  const std::string first = etcd.transport.calls.back().url.substr(0, 20);
  // The member that answered so far goes silent (blackholed, connection kept).
  etcd.fault = [&](const Endpoint& ep, const Request&) -> std::optional<Step> {
    if (ep.text == "http://10.0.0.1:2379") return silent();
    return std::nullopt;
  };
  clock.t = ns_of(lock.next_renewal());
  const long long t1 = clock.t;
  REQUIRE(lock.renew(lock.term_by()));
  CHECK(ns_of(lock.expiry()) == t1 + 300 * kMs + 3 * kSec);  // the second attempt began 300 ms later
  CHECK(lock.endpoint() == "http://10.0.0.2:2379");
  // Every member silent: renew gives up at its bound, the deadlines unmoved.
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return silent(); };
  const long long term_by = ns_of(lock.term_by());
  clock.t = ns_of(lock.next_renewal());
  REQUIRE(lock.renew(instant_ns(clock.t + 700 * kMs)));
  CHECK(clock.t <= clock.t);
  CHECK(ns_of(lock.term_by()) == term_by);
  CHECK(ns_of(lock.next_renewal()) <= clock.t + 25 * kMs);
}

TEST_CASE("cluster lock: a leader election shorter than the outage tolerance does not lose the lease") {
  // TTL 3, default kill-after: the leader dies just before the next renewal
  // is due, and a new one takes `election` to come up. Meanwhile the dead
  // leader's port refuses, and the followers either say "no leader" at once
  // or hold the keepalive until the new leader answers it (etcd 3.4 forwards
  // a follower's keepalives to the leader), or one of them is blackholed.
  enum Mode { NoLeader, Held, Blackholed };
  for (Mode mode : {NoLeader, Held, Blackholed}) {
    for (long long election : {1000 * kMs, 1600 * kMs, 1900 * kMs}) {
      CAPTURE(mode);
      CAPTURE(election);
      FakeClock clock;
      MiniEtcd etcd(clock);
      Logger log = quiet_log();
      ClusterLock lock(etcd.transport, endpoints(3), "n", 3, lease_timing::default_kill_after(3), log, {}, clock);
      REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
      const long long start = ns_of(lock.next_renewal()) - kMs;
      const long long election_end = start + election;
      const std::string alive = "{\"result\":{\"ID\":\"" + std::to_string(lock.lease()) + "\",\"TTL\":\"3\"}}\n";
      etcd.fault = [&](const Endpoint& ep, const Request&) -> std::optional<Step> {
        if (clock.t >= election_end) return std::nullopt;
        if (ep.text == "http://10.0.0.1:2379") return refused();  // the dead leader
        if (mode == Blackholed && ep.text == "http://10.0.0.2:2379") return silent();
        if (mode == NoLeader) return http(503, R"({"error":"etcdserver: no leader","code":14})");
        return answer(alive, election_end - clock.t + kMs);  // held until the new leader answers
      };
      // The job loop: renew when due, never past the TERM deadline.
      bool terminated = false;
      while (clock.t < start + 6 * kSec) {
        if (clock.t >= ns_of(lock.term_by())) {
          terminated = true;
          break;
        }
        if (clock.t >= ns_of(lock.next_renewal())) {
          REQUIRE(lock.renew(lock.term_by()));
          continue;
        }
        clock.t = std::min(ns_of(lock.next_renewal()), ns_of(lock.term_by()));
      }
      CHECK_FALSE(terminated);
      CHECK(ns_of(lock.expiry()) > election_end);
    }
  }
}

TEST_CASE("cluster lock: an outage longer than the tolerance ends in TERM before etcd's expiry") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(3), "n", 3, lease_timing::default_kill_after(3), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  const long long last_sent = ns_of(lock.expiry()) - 3 * kSec;
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return silent(); };
  while (clock.t < ns_of(lock.term_by())) {
    if (clock.t >= ns_of(lock.next_renewal())) {
      REQUIRE(lock.renew(lock.term_by()));
      CHECK(clock.t <= ns_of(lock.term_by()));  // renew returns by its bound
      continue;
    }
    clock.t = std::min(ns_of(lock.next_renewal()), ns_of(lock.term_by()));
  }
  CHECK(ns_of(lock.term_by()) == last_sent + 3 * kSec - 230 * kMs - 500 * kMs);
  CHECK(ns_of(lock.kill_by()) < last_sent + 3 * kSec);  // and etcd expires it no earlier than it received the grant
}

TEST_CASE("cluster lock: etcd says the lease is gone: renew is false, with the reason") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  etcd.drop_lease(lock.lease());  // revoked by an operator
  clock.t = ns_of(lock.next_renewal());
  CHECK(!lock.lost_at());
  CHECK_FALSE(lock.renew(lock.term_by()));
  CHECK(lock.lost());
  CHECK(lock.lost_at() == instant_ns(clock.t));
  CHECK(lock.lost_why().find("gone") != std::string::npos);
}

TEST_CASE("cluster lock: unanswered renewals leave term_by where it was; then the loss is declared") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(2), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> { return refused(); };
  const long long term_by = ns_of(lock.term_by());
  // As the job loop does: renew when due, never past term_by.
  while (clock.t < ns_of(lock.term_by())) {
    if (clock.t >= ns_of(lock.next_renewal())) CHECK(lock.renew(lock.term_by()));
    clock.t += 50 * kMs;
  }
  CHECK(ns_of(lock.term_by()) == term_by);  // nothing answered: the deadline did not move
  CHECK_FALSE(lock.lost());
  lock.declare_lost(lock.overdue_why());
  CHECK(lock.lost());
  CHECK(lock.lost_at() == instant_ns(clock.t));
  CHECK(lock.lost_why().find("safety window") != std::string::npos);
  // Durations in the one grammar looplock prints (it said "0.60 s").
  CHECK(lock.lost_why().find("(TTL 3.0s, kill-after 600ms, margin 230ms; last answered one sent ") !=
        std::string::npos);
  CHECK(lock.lost_why().find(" s,") == std::string::npos);
  CHECK(ns_of(lock.kill_by()) - ns_of(lock.term_by()) == 600 * kMs);
  lock.set_kill_after(std::chrono::seconds(1));
  CHECK(ns_of(lock.kill_by()) - ns_of(lock.term_by()) == kSec);
}

TEST_CASE("cluster lock: a waiter queues once and takes the lock in its turn, renewing meanwhile") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder(holder("hA", 1, "1")));
  const long long b = etcd.contender("n", encode_cluster_holder(holder("hB", 2, "2")));
  etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(a); });
  etcd.at(t0 + 4 * kSec, [&] { etcd.drop_lease(b); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 4 * kSec);
  CHECK(clock.t < t0 + 4 * kSec + 10 * kMs);       // woken by the deletion, not by a poll
  CHECK(etcd.transport.count("/v3/kv/txn") == 1);  // queued once
  // Renewed every third of the TTL (1 s) while waiting, no more often.
  CHECK(etcd.transport.count("/v3/lease/keepalive") >= 3);
  CHECK(etcd.transport.count("/v3/lease/keepalive") <= 5);
  CHECK(lock.fencing_token() > etcd.kvs.size());
  // Its place was kept: its key is the one created at the start.
  CHECK(etcd.kvs.at(lock.key()).create == lock.fencing_token());
  CHECK(ns_of(lock.expiry()) > clock.t + 2 * kSec);
  // The value's acquired_at is rewritten at the first renewal (off the hand-off's path).
  clock.t = ns_of(lock.next_renewal());
  REQUIRE(lock.renew(lock.term_by()));
  CHECK(parse_cluster_holder(etcd.kvs.at(lock.key()).value).value()["fencing_token"] == lock.fencing_token());
}

TEST_CASE("cluster lock: a waiter's watch is ended by etcd at each renewal and watched again, queue unread") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder(holder("hA", 1, "1")));
  etcd.at(t0 + 10 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 10 * kSec);
  CHECK(clock.t < t0 + 10 * kSec + 10 * kMs);  // woken by the deletion
  const auto& calls = etcd.transport.calls;
  size_t watches = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    CAPTURE(i);
    CAPTURE(c.path);
    // Every request of the wait goes on the kept connection.
    CHECK_FALSE(c.fresh);
    if (c.path != "/v3/watch") continue;
    ++watches;
    // etcd is asked to end the watch before the round's deadline (the next
    // renewal), with room for its end to arrive.
    CHECK(c.server_timeout_ns > 0);
    CHECK(c.at + c.server_timeout_ns <= c.deadline_ns - 100 * kMs);
  }
  CHECK(watches >= 9);  // a round a second (a third of the TTL) for 10 s
  CHECK(watches <= 12);
  // The queue was read by the join, and once more after the news, not after
  // each round: each round watched the same key again from the same revision.
  CHECK(etcd.transport.count("/v3/kv/range") == 1);
  // At --ttl 3 a holder renews every 250 ms and a waiter every second: the
  // lease is renewed before the command starts (its value rewritten later).
  CHECK(calls.back().path == "/v3/lease/keepalive");
  CHECK(calls[calls.size() - 2].path == "/v3/kv/range");
  CHECK(etcd.transport.count("/v3/kv/txn") == 1);
  std::set<std::string> bodies;
  for (const auto& c : calls) {
    if (c.path == "/v3/watch") bodies.insert(c.body);
  }
  CHECK(bodies.size() == 1);
}

TEST_CASE("cluster lock: a waiter whose watched revision is compacted reads the queue again and takes its turn") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder(holder("hA", 1, "1")));
  // Other keys are written (the store's revision moves on), and etcd compacts
  // past the revision the waiter watches from; then the holder releases.
  etcd.at(t0 + 1500 * kMs, [&] {
    etcd.contender("other", "");
    etcd.contender("other", "");
    etcd.compacted = etcd.revision;
  });
  etcd.at(t0 + 4 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  // Watching the compacted revision again and again would never see the
  // release: the deadline would pass on a free lock.
  REQUIRE(lock.acquire(bounded(10 * kSec), instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 4 * kSec);
  CHECK(clock.t < t0 + 4 * kSec + 10 * kMs);
  CHECK(etcd.transport.count("/v3/kv/range") >= 2);  // after the cancel, and after the news
  CHECK(etcd.transport.count("/v3/watch") < 12);     // no spinning
  CHECK(etcd.compacted > 0);
}

TEST_CASE("cluster lock: a holder renews as often as riding out 2.5 s needs, a waiter every third of the TTL") {
  for (int ttl : {3, 5, 10}) {
    CAPTURE(ttl);
    FakeClock clock;
    MiniEtcd etcd(clock);
    Logger log = quiet_log();
    const long long ka = lease_timing::default_kill_after(ttl).count();
    ClusterLock lock(etcd.transport, endpoints(1), "n", ttl, Duration(ka), log, {}, clock);
    const long long t0 = clock.t;
    REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(t0), me()) == Acquisition::Acquired);
    // Holding for 10 s, renewing when due, as the job loop does.
    const long long end = clock.t + 10 * kSec;
    int renewals = 0;
    while (ns_of(lock.next_renewal()) < end) {
      clock.t = std::max(clock.t, ns_of(lock.next_renewal()));
      REQUIRE(lock.renew(lock.term_by()));
      ++renewals;
    }
    const long long every = timing_ns::holder_renewal_ns(ttl, ka);
    CHECK(renewals >= static_cast<int>(10 * kSec / every) - 1);
    CHECK(renewals <= static_cast<int>(10 * kSec / every) + 1);
    lock.release();
  }
}

TEST_CASE("cluster lock: a bounded wait times out, naming the holder, and leaves the queue") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  etcd.contender("n", encode_cluster_holder(holder("hA", 77, "1")));
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  const long long t0 = clock.t;
  REQUIRE(lock.acquire(bounded(1500 * kMs), instant_ns(t0), me()) == Acquisition::TimedOut);
  CHECK(clock.t >= t0 + 1500 * kMs);
  CHECK(clock.t < t0 + 1600 * kMs);
  REQUIRE(lock.blocker());
  CHECK((*lock.blocker())["pid"] == 77);
  CHECK(etcd.kvs.size() == 1);  // our key went with our lease
}

TEST_CASE("cluster lock: single_flight skips without queuing when any contender exists") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  etcd.contender("n", "");  // etcdctl lock: no value
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Busy);
  CHECK(etcd.kvs.size() == 1);
  CHECK_FALSE(lock.blocker());
  CHECK(describe_cluster_holder(lock.blocker()).find("etcdctl") != std::string::npos);
  ClusterLock free_lock(etcd.transport, endpoints(1), "m", 3, std::chrono::milliseconds(600), log, {}, clock);
  CHECK(free_lock.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Acquired);
}

TEST_CASE("cluster lock: a blocking waiter rides out etcd being unavailable and keeps its place") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder(holder("hA", 1, "1")));
  // etcd freezes at t0 + 0.9 s for 1.7 s (SIGSTOP: what was sent meanwhile
  // is answered when it goes on), over the renewal due at t0 + 1 s; the
  // holder releases at t0 + 5 s. A waiter renews every third of the TTL: its
  // lease (3 s from t0) outlives the freeze.
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> {
    if (clock.t >= t0 + 900 * kMs && clock.t < t0 + 2600 * kMs) {
      return Step{.kind = Step::Delay, .status = 0, .body = "", .took_ns = t0 + 2600 * kMs - clock.t};
    }
    return std::nullopt;
  };
  etcd.at(t0 + 5 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(clock.t >= t0 + 5 * kSec);
  CHECK(etcd.transport.count("/v3/kv/txn") == 1);  // the lease and the place survived
}

TEST_CASE("cluster lock: a waiter whose lease expired in a long outage queues again") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  const long long a = etcd.contender("n", encode_cluster_holder(holder("hA", 1, "1")));
  etcd.fault = [&](const Endpoint&, const Request&) -> std::optional<Step> {
    if (clock.t >= t0 + kSec && clock.t < t0 + 5 * kSec) return silent();  // longer than the TTL
    return std::nullopt;
  };
  etcd.at(t0 + 6 * kSec, [&] { etcd.drop_lease(a); });
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(lock.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
  CHECK(etcd.transport.count("/v3/lease/grant") == 2);
  CHECK(etcd.transport.count("/v3/kv/txn") == 2);
}

TEST_CASE("cluster lock: etcd unreachable from the start is 69 within the deadline") {
  FakeClock clock;
  FakeTransport t(clock);
  t.handler = [](const Endpoint&, const Request&) { return refused(); };
  Logger log = quiet_log();
  ClusterLock lock(t, endpoints(2), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  const long long t0 = clock.t;
  try {
    lock.acquire(bounded(500 * kMs), instant_ns(t0), me());
    FAIL("no throw");
  } catch (const Fatal& f) {
    CHECK(f.status() == 69);
    CHECK(std::string(f.what()).find("etcd unavailable") != std::string::npos);
  }
  CHECK(clock.t == t0 + 500 * kMs);
}

TEST_CASE("cluster lock: x and x/lock/y have keys of their own and do not exclude each other") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock nested(etcd.transport, endpoints(1), "x/lock/y", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(nested.acquire(bounded(kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  CHECK(nested.key() == "looplock/x%2Flock%2Fy/lock/" + lease_hex(nested.lease()));
  // The same key under the unencoded prefix too, in the same transaction, for
  // earlier versions and etcdctl lock.
  const auto keys = etcd.keys_of(nested.lease());
  REQUIRE(keys.size() == 2);
  const std::string legacy = "looplock/x/lock/y/lock/" + lease_hex(nested.lease());
  REQUIRE(etcd.kvs.contains(legacy));
  CHECK(etcd.kvs.at(legacy).create == nested.fencing_token());
  CHECK(etcd.kvs.at(legacy).value == etcd.kvs.at(nested.key()).value);
  // That legacy key lies under "x"'s prefix, but it is not x's contender.
  for (auto plan : {kNoWait, bounded(kSec), kBlocking}) {
    ClusterLock x(etcd.transport, endpoints(1), "x", 3, std::chrono::milliseconds(600), log, {}, clock);
    const long long t0 = clock.t;
    CHECK(x.acquire(plan, instant_ns(t0), me()) == Acquisition::Acquired);
    CHECK(clock.t < t0 + 100 * kMs);
    CHECK(x.key() == "looplock/x/lock/" + lease_hex(x.lease()));
    // ... and x's key is not x/lock/y's.
    ClusterLock other(etcd.transport, endpoints(1), "x/lock/y", 3, std::chrono::milliseconds(600), log, {}, clock);
    CHECK(other.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Busy);
    REQUIRE(other.blocker());
    CHECK((*other.blocker())["lease"] == lease_hex(nested.lease()));
    x.release();
  }
  nested.release();
  CHECK(etcd.kvs.empty());  // the revoke deleted both keys
}

TEST_CASE("cluster lock: an encoded name's legacy contender (an earlier looplock, etcdctl lock) holds it") {
  for (const char* value :
       {"", R"({"host":"old","pid":7,"agent_id":"cron","operation":"o","acquired_at":"T","lease":"1"})"}) {
    CAPTURE(value);
    FakeClock clock;
    MiniEtcd etcd(clock);
    Logger log = quiet_log();
    const long long old = etcd.contender_at(legacy_lock_prefix("a/b"), value);
    // single_flight skips, naming it.
    ClusterLock sf(etcd.transport, endpoints(1), "a/b", 3, std::chrono::milliseconds(600), log, {}, clock);
    REQUIRE(sf.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Busy);
    CHECK(etcd.kvs.size() == 1);
    if (*value) {
      REQUIRE(sf.blocker());
      CHECK((*sf.blocker())["pid"] == 7);
    } else {
      CHECK_FALSE(sf.blocker());
    }
    // The deadline times out, naming it.
    ClusterLock w(etcd.transport, endpoints(1), "a/b", 3, std::chrono::milliseconds(600), log, {}, clock);
    long long t0 = clock.t;
    REQUIRE(w.acquire(bounded(kSec), instant_ns(t0), me()) == Acquisition::TimedOut);
    CHECK(clock.t >= t0 + kSec);
    CHECK(etcd.kvs.size() == 1);
    if (*value) CHECK((*w.blocker())["pid"] == 7);
    // A waiter waits for it, and takes the lock when it is gone.
    t0 = clock.t;
    etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(old); });
    ClusterLock b(etcd.transport, endpoints(1), "a/b", 3, std::chrono::milliseconds(600), log, {}, clock);
    REQUIRE(b.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
    CHECK(clock.t >= t0 + 2 * kSec);
    CHECK(clock.t < t0 + 2 * kSec + 10 * kMs);
  }
}

TEST_CASE("cluster lock: new and legacy contenders of an encoded name queue in one order") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  const long long t0 = clock.t;
  // A new holder (both keys), then an earlier looplock queued behind it (legacy key only).
  ClusterLock first(etcd.transport, endpoints(1), "a/b", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(first.acquire(bounded(kSec), instant_ns(t0), me()) == Acquisition::Acquired);
  const long long old = etcd.contender_at(legacy_lock_prefix("a/b"), "");
  const long long first_lease = first.lease();
  etcd.at(t0 + kSec, [&] { etcd.drop_lease(first_lease); });  // its release (the revoke deletes both keys)
  etcd.at(t0 + 2 * kSec, [&] { etcd.drop_lease(old); });
  ClusterLock third(etcd.transport, endpoints(1), "a/b", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(third.acquire(kBlocking, instant_ns(t0), me()) == Acquisition::Acquired);
  // Not at the first release: the legacy contender came before it.
  CHECK(clock.t >= t0 + 2 * kSec);
  CHECK(third.fencing_token() > etcd.kvs.size());
}

TEST_CASE("cluster lock: another name's keys deeper under the prefix do not hold it") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  // An earlier looplock holding "x/lock/y" (its key under x's prefix).
  etcd.contender_at(legacy_lock_prefix("x/lock/y"), encode_cluster_holder(holder("old", 9, "1")));
  ClusterLock sf(etcd.transport, endpoints(1), "x", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(sf.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Acquired);
  // The compare on the prefix failed: queued, found first, holds.
  CHECK(etcd.transport.count("/v3/kv/txn") == 2);
  ClusterLock sf2(etcd.transport, endpoints(1), "x", 3, std::chrono::milliseconds(600), log, {}, clock);
  REQUIRE(sf2.acquire(kNoWait, instant_ns(clock.t), me()) == Acquisition::Busy);
  REQUIRE(sf2.blocker());
  CHECK((*sf2.blocker())["lease"] == lease_hex(sf.lease()));
  CHECK(etcd.kvs.size() == 2);  // sf2's key went with its lease
}

TEST_CASE("cluster holder value") {
  ClusterHolder h = holder("host\n1", 42, "abc");
  h.acquired_at = "2026-11-30T17:00:00.000Z";
  h.fencing_token = 7;
  auto j = parse_cluster_holder(encode_cluster_holder(h));
  REQUIRE(j);
  CHECK((*j)["pid"] == 42);
  CHECK((*j)["fencing_token"] == 7);
  CHECK((*j)["lease"] == "abc");
  h.fencing_token = 0;
  CHECK_FALSE(parse_cluster_holder(encode_cluster_holder(h))->contains("fencing_token"));
  CHECK_FALSE(parse_cluster_holder("[]"));
  // What tells its looplock apart, and its lease's TTL: written when known.
  for (const char* k : {"pid_start", "boot_id", "pid_ns", "ttl"}) CHECK_FALSE(j->contains(k));
  h.pid_start = "68907";
  h.boot_id = "b";
  h.pid_ns = "4026531836";
  h.ttl_s = 10;
  j = parse_cluster_holder(encode_cluster_holder(h));
  CHECK((*j)["pid_start"] == "68907");
  CHECK((*j)["boot_id"] == "b");
  CHECK((*j)["pid_ns"] == "4026531836");
  CHECK((*j)["ttl"] == 10);
  CHECK_FALSE(j->contains("hold"));
  h.hold = true;  // --hold: its steps renew its lease after its looplock is gone
  CHECK((*j = *parse_cluster_holder(encode_cluster_holder(h)))["hold"] == true);
  // Proven dead on this host: a hold's key still stays while a step runs.
  h.boot_id = looplock::sys::boot_id();
  h.pid_ns = looplock::sys::pid_namespace();
  h.pid = 0x7ffffffe;  // no such pid
  h.pid_start = "1";
  if (looplock::sys::proven_dead(h.boot_id, h.pid_ns, h.pid, h.pid_start)) {  // not where /proc cannot tell (Windows)
    const std::string note = dead_contender_note(*parse_cluster_holder(encode_cluster_holder(h)));
    CHECK(note.find("has ended (this host), but it took a --hold: its key stays while any step of the hold runs") !=
          std::string::npos);
    h.hold = false;
    CHECK(dead_contender_note(*parse_cluster_holder(encode_cluster_holder(h))) ==
          "; its looplock is dead (this host): its key goes when its lease expires, within 10s");
  }
}

TEST_CASE("a holder id names a ledger's entry by host, pid and, when both know it, pid_start") {
  looplock::RunEntry e;
  e.host = "h1";
  e.pid = 42;
  e.pid_start = "100";
  CHECK(looplock::HolderId{.host = "h1", .pid = 42, .pid_start = "100"}.names(e));
  CHECK(looplock::HolderId{.host = "h1", .pid = 42, .pid_start = ""}.names(e));  // an earlier version's: none
  CHECK_FALSE(looplock::HolderId{.host = "h1", .pid = 42, .pid_start = "101"}.names(e));  // a reused pid
  CHECK_FALSE(looplock::HolderId{.host = "h2", .pid = 42, .pid_start = ""}.names(e));
  e.pid_start.clear();
  CHECK(looplock::HolderId{.host = "h1", .pid = 42, .pid_start = "101"}.names(e));
}

TEST_CASE("the cluster lock words each cause's fix in looplock's options") {
  CHECK(cause_hint(Cause::None, "http://h:1").empty());
  CHECK(cause_hint(Cause::SpeaksTls, "http://h:1") == "The endpoint speaks TLS: use https://h:1 (and --etcd-cacert).");
  CHECK(cause_hint(Cause::SpeaksPlainHttp, "https://h:1").starts_with("Use http://h:1 for this endpoint"));
  CHECK(cause_hint(Cause::TlsRejected, "https://h:1").starts_with("Check --etcd-cacert"));
  CHECK(cause_hint(Cause::NotTls, "https://h:1").find("does not answer in TLS") != std::string::npos);
  CHECK(cause_hint(Cause::BadCredentials, "").find("--etcd-user") != std::string::npos);
  CHECK(cause_hint(Cause::PermissionDenied, "").find("looplock/") != std::string::npos);
  CHECK(cause_hint(Cause::CommonNameRefused, "").find("CommonName") != std::string::npos);
}

TEST_CASE("cluster lock: the run ledger's write and look say why they failed, each its own failure") {
  FakeClock clock;
  MiniEtcd etcd(clock);
  Logger log = quiet_log();
  ClusterLock lock(etcd.transport, endpoints(1), "n", 3, std::chrono::milliseconds(600), log, {}, clock);
  lock.set_ledger_operation("tick");
  REQUIRE(lock.acquire(bounded(5 * kSec), instant_ns(clock.t), me()) == Acquisition::Acquired);
  const auto none = lock.ledger(instant_ns(clock.t + kSec));
  CHECK_FALSE(none.entry);
  RunEntry e;
  e.host = "h";
  e.operation = "tick";
  e.pid = 12;
  e.started_ms = 1000;
  CHECK_FALSE(lock.write_ledger(e, instant_ns(clock.t + kSec)));  // written
  const auto peeked = lock.peek_ledger(instant_ns(clock.t + kSec));
  REQUIRE(std::holds_alternative<ClusterLock::LedgerEntry>(peeked));
  CHECK(std::get<ClusterLock::LedgerEntry>(peeked).entry->pid == 12);
  // The lease gone (the lock key with it): the guarded write is refused.
  lock.release();
  const auto refused = lock.write_ledger(e, instant_ns(clock.t + kSec));
  REQUIRE(refused);
  CHECK(refused->what == "etcd refused the write (the lease was lost)");
  // etcd not answering: the look's failure says so.
  etcd.transport.handler = [](const Endpoint&, const Request&) { return silent(); };
  const auto silent_look = lock.peek_ledger(instant_ns(clock.t + kSec));
  REQUIRE(std::holds_alternative<sys::Failure>(silent_look));
  CHECK_FALSE(std::get<sys::Failure>(silent_look).what.empty());
}

TEST_CASE("-p coalesce: each absorbed note belongs to its waiter's key, or to the same looplock queued again") {
  const std::string root = etcd::absorbed_root("n");
  auto contender = [](long long lease, long long rev, const char* host, long long pid, const char* start) {
    Json v = {{"host", host}, {"pid", pid}, {"pid_start", start}, {"policy", "coalesce"}, {"operation", "tick"}};
    return KeyValue{.key = "k" + std::to_string(lease), .value = dump_json(v), .create_revision = rev,
                    .mod_revision = rev, .lease = lease};
  };
  auto note = [&](long long waiter_lease, long long run, const Json& waiter) {
    const Json v = {{"operation", "tick"}, {"started_ms", 1000}, {"waiter", waiter}};
    return KeyValue{.key = etcd::absorbed_prefix("n", waiter_lease) + etcd::lease_hex(run), .value = dump_json(v),
                    .create_revision = 9, .mod_revision = 9, .lease = 0};
  };
  const std::vector<KeyValue> queue = {contender(0x10, 1, "h", 7, "70"), contender(0x20, 2, "h", 8, "80")};
  const auto sorted = sort_absorbed(root,
                                    {note(0x20, 1, {{"host", "h"}, {"pid", 8}, {"pid_start", "80"}}),
                                     note(0x99, 2, {{"host", "h"}, {"pid", 8}, {"pid_start", "80"}}),  // queued again
                                     note(0x98, 3, {{"host", "h"}, {"pid", 8}, {"pid_start", "81"}}),  // another process
                                     note(0x97, 4, {{"host", "g"}, {"pid", 8}}),                        // another host
                                     note(0x96, 5, {{"host", "h"}, {"pid", 7}})},  // no start time: host and pid
                                    queue);
  REQUIRE(sorted.size() == 5);
  CHECK(sorted[0].owner == 1u);
  CHECK(sorted[1].owner == 1u);
  CHECK_FALSE(sorted[2].owner);
  CHECK_FALSE(sorted[3].owner);
  CHECK(sorted[4].owner == 0u);
  CHECK(sorted[0].operation() == "tick");
}

TEST_CASE("-p coalesce: a note left behind needs no run when the ledger's last run covers it") {
  AbsorbedNote n;
  n.value = Json{{"operation", "tick"}, {"started_ms", 1000}};
  RunEntry last;
  last.started_ms = 1000;
  CHECK_FALSE(absorbed_covered(n, last));  // not ended: it may not count
  last.ended_ms = 2000;
  CHECK(absorbed_covered(n, last));  // started with it (or after it): did its work
  last.started_ms = 500;
  CHECK_FALSE(absorbed_covered(n, last));  // started before it, no slot
  last.once_per_ms = 501;
  CHECK(absorbed_covered(n, last));  // inside the slot: it would have skipped
  last.once_per_ms = 500;
  CHECK_FALSE(absorbed_covered(n, last));  // the slot was over when it came
  CHECK_FALSE(absorbed_covered(n, std::nullopt));
  n.value = nullptr;
  CHECK_FALSE(absorbed_covered(n, last));
}
