// The Windows side of tests/windows/: what the loop scripts' own helper
// and a Windows parent do, for the tests that drive looplock.exe under wine.
//
//   winhelper lock PATH   open PATH and lock it as Python's msvcrt.locking(fd,
//                         LK_NBLCK, 1) does: the C runtime's _locking on
//                         byte 0, taken from ucrtbase.dll as CPython takes it.
//                         Prints "locked" (then holds it until its stdin
//                         ends) or "busy" (exit 1).
//   winhelper run PROGRAM [ARG]...
//                         runs PROGRAM and prints its exit code, all 32 bits,
//                         as a Windows parent sees it (wine passes 8 bits on).
//   winhelper tree FILE SECONDS
//                         starts a child of its own that sleeps SECONDS,
//                         writes "PARENT CHILD" (Windows pids) to FILE, and
//                         sleeps SECONDS itself: a job with a grandchild.
//   winhelper sleep SECONDS
//   winhelper alive PID   exit 0 when process PID runs, 1 when it does not.
//   winhelper exit CODE   exits with CODE (decimal or 0x...).
//   winhelper ctrlc       sends Ctrl-C to every process of its console
//                         (GenerateConsoleCtrlEvent, group 0), itself
//                         included, then sleeps 20 s; exit 1 when it could
//                         not send it.
//   winhelper delete PATH DeleteFileA: exit 0 when deleted, 1 when not.
//   winhelper hold PATH   opens PATH as a reader that does not share delete
//                         (a metrics scraper, a virus scanner), prints "open",
//                         and closes it once its stdin ends.
//   winhelper args [ARG]...
//                         prints each argument as the C runtime's rules
//                         (CommandLineToArgvW) read its command line, in
//                         UTF-8, one "<ARG>" per line.
#include <windows.h>
#include <shellapi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using OpenFn = int(__cdecl*)(const char*, int, ...);
using LockingFn = int(__cdecl*)(int, int, long);

int lock(const char* path) {
  // ucrtbase's own descriptors: a descriptor of one C runtime means nothing
  // to another, so _open comes from the same DLL as _locking.
  HMODULE ucrt = LoadLibraryA("ucrtbase.dll");
  if (!ucrt) return 3;
  auto open = reinterpret_cast<OpenFn>(reinterpret_cast<void (*)()>(GetProcAddress(ucrt, "_open")));
  auto locking = reinterpret_cast<LockingFn>(reinterpret_cast<void (*)()>(GetProcAddress(ucrt, "_locking")));
  if (!open || !locking) return 3;
  const int fd = open(path, 0x0002 | 0x0100 | 0x8000, 0600);  // _O_RDWR | _O_CREAT | _O_BINARY
  if (fd < 0) return 3;
  if (locking(fd, 2 /* _LK_NBLCK */, 1) != 0) {
    std::puts("busy");
    std::fflush(stdout);
    return 1;
  }
  std::puts("locked");
  std::fflush(stdout);
  char buf[64];
  while (std::fgets(buf, sizeof buf, stdin)) {
  }
  locking(fd, 0 /* _LK_UNLCK */, 1);
  return 0;
}

int run(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) line += std::string(i ? " " : "") + "\"" + argv[i] + "\"";
  STARTUPINFOA si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  if (!CreateProcessA(nullptr, line.data(), nullptr, nullptr, TRUE, 0, nullptr, nullptr, &si, &pi)) return 3;
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 0;
  GetExitCodeProcess(pi.hProcess, &code);
  std::printf("exit %lu\n", static_cast<unsigned long>(code));
  return 0;
}

int tree(const char* file, const char* seconds) {
  char self[MAX_PATH];
  GetModuleFileNameA(nullptr, self, MAX_PATH);
  std::string line = std::string("\"") + self + "\" sleep " + seconds;
  STARTUPINFOA si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  if (!CreateProcessA(nullptr, line.data(), nullptr, nullptr, FALSE, 0, nullptr, nullptr, &si, &pi)) return 3;
  FILE* f = std::fopen(file, "w");
  if (!f) return 3;
  std::fprintf(f, "%lu %lu\n", GetCurrentProcessId(), pi.dwProcessId);
  std::fclose(f);
  Sleep(static_cast<DWORD>(std::atoi(seconds)) * 1000);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string what = argv[1];
  if (what == "lock" && argc == 3) return lock(argv[2]);
  if (what == "run" && argc >= 3) return run(argc - 2, argv + 2);
  if (what == "tree" && argc == 4) return tree(argv[2], argv[3]);
  if (what == "sleep" && argc == 3) {
    Sleep(static_cast<DWORD>(std::atoi(argv[2])) * 1000);
    return 0;
  }
  if (what == "alive" && argc == 3) {
    HANDLE h = OpenProcess(SYNCHRONIZE, FALSE, static_cast<DWORD>(std::atoi(argv[2])));
    if (!h) return 1;
    const bool running = WaitForSingleObject(h, 0) == WAIT_TIMEOUT;
    CloseHandle(h);
    return running ? 0 : 1;
  }
  if (what == "args") {
    int n = 0;
    LPWSTR* args = CommandLineToArgvW(GetCommandLineW(), &n);
    for (int i = 2; args && i < n; ++i) {
      const int size = WideCharToMultiByte(CP_UTF8, 0, args[i], -1, nullptr, 0, nullptr, nullptr);
      std::string out(static_cast<size_t>(size > 0 ? size : 1), '\0');
      WideCharToMultiByte(CP_UTF8, 0, args[i], -1, out.data(), size, nullptr, nullptr);
      out.resize(std::strlen(out.c_str()));
      std::fwrite("<", 1, 1, stdout);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fwrite(">\n", 1, 2, stdout);
    }
    return 0;
  }
  if (what == "hold" && argc == 3) {
    HANDLE h =
        CreateFileA(argv[2], GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE, nullptr, OPEN_EXISTING, 0, nullptr);
    if (h == INVALID_HANDLE_VALUE) return 3;
    std::puts("open");
    std::fflush(stdout);
    char buf[64];
    while (std::fgets(buf, sizeof buf, stdin)) {
    }
    CloseHandle(h);
    return 0;
  }
  if (what == "ctrlc" && argc == 2) {
    if (!GenerateConsoleCtrlEvent(CTRL_C_EVENT, 0)) return 1;
    Sleep(20000);
    return 0;
  }
  if (what == "delete" && argc == 3) return DeleteFileA(argv[2]) ? 0 : 1;
  if (what == "exit" && argc == 3) ExitProcess(static_cast<UINT>(std::strtoul(argv[2], nullptr, 0)));
  return 2;
}
