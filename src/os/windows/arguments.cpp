// arguments.hpp on Windows: GetCommandLineW split by CommandLineToArgvW
// (the C runtime's rules) and GetEnvironmentStringsW, as UTF-8. The
// "=C:=C:\dir" entries, the working directory of each drive, are left out,
// as the C runtime's environ does.
#include "os/arguments.hpp"

// clang-format off
#include <windows.h>
#include <shellapi.h>
// clang-format on

#include "os/windows/support.hpp"

namespace looplock::sys {

ProgramText::ProgramText(int argc, char** argv, char** envp) {
  int n = 0;
  LPWSTR* wide = CommandLineToArgvW(GetCommandLineW(), &n);
  if (wide == nullptr) {  // no memory: the narrow forms, as the C runtime made them
    argv_.assign(argv, argv + argc + 1);
    size_t e = 0;
    while (envp && envp[e]) ++e;
    envp_.assign(envp, envp + e);
    envp_.push_back(nullptr);
    return;
  }
  for (int i = 0; i < n; ++i) text_.push_back(windows::utf8(wide[i]));
  LocalFree(wide);
  const size_t args = text_.size();
  if (LPWCH block = GetEnvironmentStringsW()) {
    for (const wchar_t* p = block; *p; p += wcslen(p) + 1) {
      if (*p != L'=') text_.push_back(windows::utf8(p));
    }
    FreeEnvironmentStringsW(block);
  }
  for (size_t i = 0; i < text_.size(); ++i) (i < args ? argv_ : envp_).push_back(text_[i].data());
  argv_.push_back(nullptr);
  envp_.push_back(nullptr);
}

}  // namespace looplock::sys
