// What ends a wait that looplock makes while the job runs (a lease's
// renewal, an etcd call) before its time: on POSIX, a set of signals that
// are blocked and looked for as pending. Opaque here, so that the code that
// passes it along is the same on every system; each system's code defines it
// (os/posix/interrupts.hpp).
#pragma once

namespace looplock::sys {

struct Interrupts;

}  // namespace looplock::sys
