// os/interrupts.hpp on Windows: nothing ends a wait early there (no lease is
// renewed while a job runs: --etcd is not built for Windows), so the set is
// empty.
#pragma once

namespace looplock::sys {

struct Interrupts {};

}  // namespace looplock::sys
