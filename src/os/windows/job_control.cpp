// os/job_control.hpp on Windows, after Microsoft's documentation of each
// call (wine checks most of it: tests/windows/). The command is
// started with CreateProcessW, suspended, put in a Job Object of its own
// whose handle no process inherits, and only then resumed, so that all it
// starts is in the job from its first instruction. The job is created with
// JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: when looplock.exe exits, however it
// ends (killed, its console closed), the system closes the handle and ends
// every process of the job. Jobs nest (Windows 8 and later), so this works
// inside a CI runner's or Task Scheduler's own job.
//
// Windows has no signals. The job runs in looplock's console process
// group, so Ctrl-C and Ctrl-Break reach it from the console as they would
// without looplock: looplock takes them itself (a console control handler
// that returns TRUE) and reports them as INT passed on, so that
// --kill-after starts. looplock ends a job with TerminateJobObject, at
// once: exit code 143 for --max-time's end, 137 for --kill-after's (the
// numbers a POSIX shell shows for TERM and KILL). No lock handle is
// inherited: the command never holds looplock's lock (-o always).
#include "os/job_control.hpp"

// clang-format off
#include <windows.h>
// clang-format on

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cwctype>

#include "os/windows/command_line.hpp"
#include "os/windows/interrupts.hpp"
#include "os/windows/support.hpp"

namespace looplock::sys {

namespace {

constexpr DWORD kTerminatedCode = 143;  // 128 + TERM
constexpr DWORD kKilledCode = 137;      // 128 + KILL

// The console's Ctrl-C and Ctrl-Break, as an event the job's wait looks at.
// The system calls the handler on a thread of its own, with no argument: the
// event is the one thing this file keeps outside an object, set once by
// take_job_control.
HANDLE g_console_break = nullptr;

BOOL WINAPI on_console_event(DWORD type) {
  if (type != CTRL_C_EVENT && type != CTRL_BREAK_EVENT) return FALSE;  // close, logoff, shutdown: the default
  if (g_console_break) SetEvent(g_console_break);
  return TRUE;
}

// A handle closed when it goes out of scope.
struct Handle {
  HANDLE h = nullptr;
  Handle() = default;
  explicit Handle(HANDLE handle) : h(handle) {}
  Handle(Handle&& o) noexcept : h(o.h) { o.h = nullptr; }
  Handle& operator=(Handle&&) = delete;
  ~Handle() {
    if (h) CloseHandle(h);
  }
};

Failure system_failure(const std::string& what) { return {.what = what, .err = windows::errno_of(GetLastError())}; }

// The value of `name` in `env` ("NAME=value" entries; Windows names are
// case-insensitive), or nullopt.
std::optional<std::string> value_in(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env) {
    if (e.size() <= name.size() || e[name.size()] != '=') continue;
    if (std::equal(name.begin(), name.end(), e.begin(), [](char a, char b) {
          return std::toupper(static_cast<unsigned char>(a)) == std::toupper(static_cast<unsigned char>(b));
        })) {
      return e.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

// The program `name` names, as CreateProcessW must be given it so that it
// runs what a shell would: a name with a path is taken as it is (relative to
// the working directory); a bare name is looked up in the job's PATH, with
// ".exe" when it has no extension (SearchPathW). Never the working
// directory first, as CreateProcessW's own search does.
// Whether `path` names a batch file (.bat, .cmd).
bool is_batch_file(const std::wstring& path) {
  const auto dot = path.find_last_of(L".\\/");
  if (dot == std::wstring::npos || path[dot] != L'.') return false;
  std::wstring ext = path.substr(dot);
  for (auto& c : ext) c = static_cast<wchar_t>(std::towlower(c));
  return ext == L".bat" || ext == L".cmd";
}

std::optional<std::wstring> program_path(const std::string& name, const std::vector<std::string>& env) {
  const std::wstring wide = windows::widen(name);
  const bool has_path = wide.find_first_of(L"\\/:") != std::wstring::npos;
  if (has_path) {
    // Relative to the working directory, as a shell takes it (SearchPathW
    // would look beside looplock.exe and in the system's directories
    // first), with ".exe" when the name has no extension and no such file.
    std::wstring full(32768, L'\0');
    const DWORD n = GetFullPathNameW(wide.c_str(), static_cast<DWORD>(full.size()), full.data(), nullptr);
    if (n == 0 || n >= full.size()) return std::nullopt;
    full.resize(n);
    if (GetFileAttributesW(full.c_str()) != INVALID_FILE_ATTRIBUTES) return full;
    const auto base = full.find_last_of(L"\\/");
    if (full.find(L'.', base == std::wstring::npos ? 0 : base) == std::wstring::npos &&
        GetFileAttributesW((full + L".exe").c_str()) != INVALID_FILE_ATTRIBUTES) {
      return full + L".exe";
    }
    SetLastError(ERROR_FILE_NOT_FOUND);
    return std::nullopt;
  }
  const auto path = value_in(env, "PATH");
  if (!path) {
    SetLastError(ERROR_FILE_NOT_FOUND);
    return std::nullopt;
  }
  const std::wstring search = windows::widen(*path);
  std::wstring found(32768, L'\0');
  const DWORD n =
      SearchPathW(search.c_str(), wide.c_str(), L".exe", static_cast<DWORD>(found.size()), found.data(), nullptr);
  if (n == 0 || n >= found.size()) {
    if (n != 0) SetLastError(ERROR_FILENAME_EXCED_RANGE);
    return std::nullopt;
  }
  found.resize(n);
  return found;
}

// The job's environment as CreateProcessW takes it: "NAME=value" entries,
// sorted by name without regard to case (as Microsoft asks), each ended by a
// NUL, and one more NUL.
std::wstring environment_block(const std::vector<std::string>& env) {
  std::vector<std::wstring> entries;
  entries.reserve(env.size());
  for (const auto& e : env) entries.push_back(windows::widen(e));
  const auto name_of = [](const std::wstring& e) {
    std::wstring n = e.substr(0, e.find(L'=', 1));  // "=C:=C:\..." keeps its leading '='
    for (auto& c : n) c = static_cast<wchar_t>(std::towupper(c));
    return n;
  };
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const std::wstring& a, const std::wstring& b) { return name_of(a) < name_of(b); });
  std::wstring block;
  for (const auto& e : entries) {
    block += e;
    block += L'\0';
  }
  block += L'\0';
  return block;
}

class WindowsJob final : public RunningJob {
public:
  WindowsJob(Handle job, Handle process, Pid pid) : job_(std::move(job)), process_(std::move(process)), pid_(pid) {}

  Pid group() const override { return pid_; }
  int terminal_error() const override { return 0; }

  Reaped reap() override {
    Reaped out;
    if (done_ || WaitForSingleObject(process_.h, 0) != WAIT_OBJECT_0) return out;
    DWORD code = 0;
    if (!GetExitCodeProcess(process_.h, &code)) {
      kill();
      out.lost_err = windows::errno_of(GetLastError());
      return out;
    }
    done_ = true;
    out.command_status = static_cast<int>(code);  // whole: an NTSTATUS such as 0xC0000005 too
    return out;
  }

  bool gone() const override {
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION info{};
    if (!QueryInformationJobObject(job_.h, JobObjectBasicAccountingInformation, &info, sizeof info, nullptr)) {
      return done_;
    }
    return info.ActiveProcesses == 0;
  }

  void terminate() override { TerminateJobObject(job_.h, kTerminatedCode); }
  void kill() override { TerminateJobObject(job_.h, kKilledCode); }

  std::optional<Forwarded> pass_signal(Deadline until) override {
    DWORD wait_ms = INFINITE;
    if (until) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - MonotonicClock::now()).count();
      wait_ms = static_cast<DWORD>(std::clamp<long long>(left, 0, INFINITE - 1));
    }
    // Once the command has ended, only the console is waited on (the loop
    // polls for the rest of the job).
    HANDLE waits[2];
    DWORD count = 0;
    if (!done_) waits[count++] = process_.h;
    if (g_console_break) waits[count++] = g_console_break;
    if (count == 0) {
      Sleep(std::min<DWORD>(wait_ms, 20));
      return std::nullopt;
    }
    const DWORD r = WaitForMultipleObjects(count, waits, FALSE, wait_ms);
    if (r == WAIT_FAILED) {
      Sleep(std::min<DWORD>(wait_ms, 20));  // never a busy loop: the job loop looks again
      return std::nullopt;
    }
    if (r >= WAIT_OBJECT_0 + count || waits[r - WAIT_OBJECT_0] != g_console_break) return std::nullopt;
    ResetEvent(g_console_break);
    return Forwarded{.signal = SIGINT, .asks_end = true};
  }

  const Interrupts& interrupting() const override { return none_; }

  std::unique_ptr<JobWarning> warning(int) override { return std::make_unique<NoWarning>(); }

private:
  // --warn-before is refused on Windows (no signals to warn with).
  class NoWarning final : public JobWarning {
  public:
    bool pass() override { return false; }
    const std::vector<Pid>& sent() const override { return none_; }
    std::vector<Pid> skipped() const override { return {}; }

  private:
    std::vector<Pid> none_;
  };

  Handle job_;
  Handle process_;
  Pid pid_;
  bool done_ = false;
  Interrupts none_;
};

class WindowsControl final : public JobControl {
public:
  std::variant<std::unique_ptr<RunningJob>, Failure> start(const JobStart& spec) override {
    // Ctrl-C is looplock's to take only once the job runs: while it waits
    // for the lock, Ctrl-C ends it as it ends any console program (POSIX:
    // INT keeps its default action until then too).
    if (!handler_set_) {
      ResetEvent(g_console_break);
      if (!SetConsoleCtrlHandler(on_console_event, TRUE)) {
        return system_failure("cannot take the console's Ctrl-C for the run (SetConsoleCtrlHandler)");
      }
      handler_set_ = true;
    }
    auto line = windows::command_line(spec.argv, spec.shell);
    if (!line) {
      return Failure{.what = "cannot start the command: Windows cannot pass a program name that holds a double quote",
                     .err = EINVAL};
    }
    const auto program = program_path(spec.argv[0], spec.env);
    if (!program) return Failure{.err = windows::errno_of(GetLastError()), .of = Failure::Of::Command};
    const DWORD attributes = GetFileAttributesW(program->c_str());
    if (attributes != INVALID_FILE_ATTRIBUTES && (attributes & FILE_ATTRIBUTE_DIRECTORY)) {
      return Failure{.err = EACCES, .of = Failure::Of::Command};  // found, and not a program: 126
    }
    // A batch file would run through cmd.exe, which reads its arguments by
    // rules of its own, not the C runtime's: an argument could run commands.
    // It runs with -c, whose text cmd.exe reads as written.
    if (!spec.shell && is_batch_file(*program)) return Failure{.err = EACCES, .of = Failure::Of::Command};
    Handle job(CreateJobObjectW(nullptr, nullptr));  // no security attributes: never inherited
    if (!job.h) return system_failure("cannot create a job object for the command");
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
    limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
    if (!SetInformationJobObject(job.h, JobObjectExtendedLimitInformation, &limits, sizeof limits)) {
      return system_failure("cannot tie the command's job to looplock's life (SetInformationJobObject)");
    }
    std::wstring env = environment_block(spec.env);
    STARTUPINFOW si{};
    si.cb = sizeof si;
    PROCESS_INFORMATION pi{};
    // Handles are inherited (the console's standard handles); looplock's
    // own are all created not inheritable.
    if (!CreateProcessW(program->c_str(), line->data(), nullptr, nullptr, TRUE,
                        CREATE_SUSPENDED | CREATE_UNICODE_ENVIRONMENT, env.data(), nullptr, &si, &pi)) {
      const DWORD error = GetLastError();
      const bool not_run = error == ERROR_FILE_NOT_FOUND || error == ERROR_PATH_NOT_FOUND ||
                           error == ERROR_ACCESS_DENIED || error == ERROR_BAD_EXE_FORMAT;
      if (not_run)
        return Failure{.err = error == ERROR_BAD_EXE_FORMAT ? EACCES : windows::errno_of(error),
                       .of = Failure::Of::Command};
      return Failure{.what = "cannot start the command (CreateProcessW)", .err = windows::errno_of(error)};
    }
    Handle process(pi.hProcess);
    Handle thread(pi.hThread);
    if (!AssignProcessToJobObject(job.h, pi.hProcess)) {
      const Failure f = system_failure("cannot put the command in a job object (AssignProcessToJobObject)");
      TerminateProcess(pi.hProcess, kKilledCode);
      return f;
    }
    if (ResumeThread(pi.hThread) == static_cast<DWORD>(-1)) {
      const Failure f = system_failure("cannot resume the command (ResumeThread)");
      TerminateJobObject(job.h, kKilledCode);
      return f;
    }
    return std::make_unique<WindowsJob>(std::move(job), std::move(process), static_cast<Pid>(pi.dwProcessId));
  }

  Failure exec(const JobStart&) override {
    return {.what = "cannot replace looplock with the command: Windows has no exec (-F)", .err = ENOSYS};
  }

private:
  bool handler_set_ = false;
};

}  // namespace

std::vector<std::string> shell_argv(const std::string& text) {
  const wchar_t* comspec = _wgetenv(L"ComSpec");
  std::string shell = comspec && *comspec ? windows::utf8(comspec) : "C:\\Windows\\System32\\cmd.exe";
  return {shell, "/d", "/s", "/c", text};
}

std::variant<std::unique_ptr<JobControl>, Failure> take_job_control(Pid) {
  if (!g_console_break) {
    g_console_break = CreateEventW(nullptr, TRUE, FALSE, nullptr);  // manual reset, not inherited
    if (!g_console_break) return system_failure("cannot create an event for the console's Ctrl-C");
  }
  return std::make_unique<WindowsControl>();
}

void exit_like(int, int exit_status) {
  std::fflush(nullptr);
  ExitProcess(static_cast<UINT>(exit_status));
}

}  // namespace looplock::sys
