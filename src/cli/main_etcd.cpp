// looplock-etcd: looplock with the cluster lock's HTTP client (libcurl). The
// static looplock execs it for runs with --etcd (cluster_exec.hpp); it is the
// same program otherwise.
#include "cli/app.hpp"
#include "cluster/etcd_curl.hpp"
#include "cluster/etcd_kind.hpp"

int main(int argc, char** argv, char** envp) {
  looplock::etcd::CurlTransport transport;
  looplock::EtcdKind cluster(transport);
  return looplock::main_program(argc, argv, envp, &cluster);
}
