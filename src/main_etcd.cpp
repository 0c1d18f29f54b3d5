// looplock-etcd: looplock with the cluster lock's HTTP client (libcurl). The
// static looplock execs it for runs with --etcd (cluster_exec.hpp); it is the
// same program otherwise.
#include "app.hpp"
#include "etcd_curl.hpp"

int main(int argc, char** argv, char** envp) {
  looplock::etcd::CurlTransport transport;
  return looplock::main_program(argc, argv, envp, &transport);
}
