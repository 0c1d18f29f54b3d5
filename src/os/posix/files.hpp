// What posix/files.cpp shows its tests: Linux's names for the network file
// systems, by statfs(2)'s f_type.
#pragma once

#include <optional>
#include <string>

namespace looplock::sys {

// "nfs", "cifs", ... for a network file system's f_type; nullopt for a local one.
std::optional<std::string> network_fs_name(unsigned long f_type);

}  // namespace looplock::sys
