"""`meson install` puts a working looplock, its man pages (looplock(1) and
the topic pages, man/*.scd) and its shell completions in the standard
places, the Debian package claims every man page, and the help, looplock(1)
and the completions agree on the options.

The install goes into a temporary --destdir from the build directory that
$LOOPLOCK belongs to (<builddir>/src/looplock), without rebuilding. That the
shells would find the completions where a real install puts them is checked
in two halves: the install directories are in the search paths of the zsh
and fish on this machine (asked with their startup files, as a user's shell
starts), and the copies in the destdir, put first in those paths, complete
in real shells (zsh in a pseudo-terminal with compinit, fish with
`complete -C`). scripts/deb does the same against the installed package.
"""
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LOOPLOCK, ROOT, SANITIZED, TIMEOUT, run

# What is installed and where is the release build's business (the
# ASan+UBSan build has no man page); the sanitizers find nothing here.
pytestmark = pytest.mark.skipif(SANITIZED, reason="installing is checked on the release build (stage default)")

BUILD_DIR = Path(LOOPLOCK).resolve().parent.parent
MAN_SOURCE = ROOT / "man" / "looplock.1.scd"
# Every page of the manual, as installed: "looplock-files.5" (in man5).
MAN_PAGES = sorted(p.name[:-len(".scd")] for p in (ROOT / "man").glob("*.scd"))
COMPLETIONS = ROOT / "completions"


def sh(args, timeout=TIMEOUT, **kw):
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout, **kw)


@pytest.fixture(scope="module")
def build_options():
    meson = shutil.which("meson")
    if meson is None:
        pytest.skip("meson is not installed")
    if not (BUILD_DIR / "meson-private" / "coredata.dat").exists():
        pytest.skip(f"$LOOPLOCK is not in a meson build directory ({BUILD_DIR})")
    r = sh([meson, "introspect", str(BUILD_DIR), "--buildoptions"])
    assert r.returncode == 0, r.stderr
    return {o["name"]: o["value"] for o in json.loads(r.stdout)}


@pytest.fixture(scope="module")
def installed(build_options, tmp_path_factory):
    """Installs into a temporary destdir; returns a function mapping an
    install path relative to the prefix ("bin/looplock") to the file."""
    dest = tmp_path_factory.mktemp("destdir")
    r = sh(["meson", "install", "-C", str(BUILD_DIR), "--destdir", str(dest), "--no-rebuild"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    prefix = Path(build_options["prefix"])

    def path(option, *rest):
        d = Path(build_options[option])
        base = d if d.is_absolute() else prefix / d
        return dest / base.relative_to("/") / Path(*rest)

    path.dest = dest
    return path


@pytest.fixture(scope="module")
def completion_paths(build_options):
    """{shell: where `meson install` puts its completion} (absolute, without
    the destdir), from the build's install plan."""
    r = sh(["meson", "introspect", str(BUILD_DIR), "--installed"])
    assert r.returncode == 0, r.stderr
    by_source = {Path(src).resolve(): Path(dst) for src, dst in json.loads(r.stdout).items()}
    return {shell: by_source[(COMPLETIONS / source).resolve()] for shell, source in COMPLETION_SOURCES.items()}


def help_text():
    r = sh([LOOPLOCK, "--help"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def help_options():
    """(long options, short options) that --help lists, before its examples."""
    text = help_text().split("\nExamples:")[0]
    longs = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text))
    shorts = set(re.findall(r"(?<![\w-])(-[A-Za-z])\b", text))
    return longs, shorts


def man_options_section():
    text = MAN_SOURCE.read_text()
    m = re.search(r"^# OPTIONS\n(.*?)^# ", text, re.M | re.S)
    assert m, "no OPTIONS section in man/looplock.1.scd"
    return m.group(1)


# -- the installed files ----------------------------------------------------


def test_installed_binary_runs(installed):
    binary = installed("bindir", "looplock")
    assert binary.is_file(), f"no {binary}"
    r = sh([str(binary), "--version"])
    assert r.returncode == 0, r.stderr
    assert re.match(r"looplock \S+\ncommit: ", r.stdout), r.stdout


def test_cluster_helper_is_installed_where_looplock_looks(installed, build_options):
    """looplock-etcd goes to LIBEXECDIR/looplock/, the directory compiled
    into looplock (cluster_exec.cpp), and runs from there."""
    helper = installed("libexecdir", "looplock", "looplock-etcd")
    if not helper.exists() and build_options.get("etcd") != "enabled":
        pytest.skip("the build has no looplock-etcd (libcurl not found, -Detcd not enabled)")
    assert helper.is_file(), f"no {helper}"
    r = sh([str(helper), "--version"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n--etcd: available, built in (this is looplock-etcd)\n"), r.stdout
    compiled_in = str(Path(build_options["prefix"]) / build_options["libexecdir"] / "looplock").encode()
    assert compiled_in in Path(LOOPLOCK).read_bytes()


def test_the_manual_has_its_pages():
    assert "looplock.1" in MAN_PAGES and "looplock-files.5" in MAN_PAGES and len(MAN_PAGES) > 5, MAN_PAGES


def section_of(name):
    return name.rsplit(".", 1)[1]


@pytest.mark.parametrize("name", MAN_PAGES)
def test_every_man_page_is_built_and_installed_by_meson(name):
    """man/meson.build renders and installs each page of man/ (its list is
    the one place a new page must be added)."""
    build = (ROOT / "man" / "meson.build").read_text()
    assert f"'{name}'" in build, f"man/meson.build does not build {name}"
    assert "install_dir : get_option('mandir') / ('man' + page.split('.')[-1])" in build


@pytest.mark.parametrize("name", MAN_PAGES)
def test_every_man_page_is_in_the_debian_package(name):
    listed = (ROOT / "debian" / "looplock.install").read_text().split()
    assert f"usr/share/man/man{section_of(name)}/{name}" in listed, f"debian/looplock.install lacks {name}"


@pytest.mark.parametrize("name", MAN_PAGES)
def test_man_page_is_installed(installed, build_options, name):
    page = installed("mandir", f"man{section_of(name)}", name)
    if not page.exists():
        if build_options.get("man") == "disabled":
            pytest.skip("the build was configured with -Dman=disabled: no man page to install")
        if shutil.which("scdoc") is None:
            pytest.skip("scdoc is not installed, so the build has no man page")
    assert page.is_file(), f"no {page}"
    assert page.read_text().startswith(".\\\" Generated by scdoc") or ".TH" in page.read_text()


@pytest.mark.parametrize("name", MAN_PAGES)
def test_man_page_renders_without_warnings(installed, tmp_path, name):
    """`man --warnings -l` has groff report every problem (an undefined
    macro, a bad escape) on stderr: there must be none."""
    if shutil.which("man") is None:
        pytest.skip("man is not installed (Debian package man-db)")
    page = installed("mandir", f"man{section_of(name)}", name)
    if not page.exists():
        scdoc = shutil.which("scdoc")
        if scdoc is None:
            pytest.skip("no installed man page and scdoc is not installed to render one")
        page = tmp_path / name
        with open(ROOT / "man" / f"{name}.scd") as src:
            r = subprocess.run([scdoc], stdin=src, capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        page.write_bytes(r.stdout)
    r = sh(["man", "--warnings", "-E", "UTF-8", "-l", str(page)], env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    if name != "looplock.1":
        assert f"{name.rsplit('.', 1)[0]} - " in r.stdout
        return
    assert "looplock - run a command while holding the lock" in r.stdout
    for long_opt in sorted(help_options()[0]):
        assert long_opt in r.stdout.replace("\u2010", "-").replace("\u2212", "-"), long_opt


COMPLETION_SOURCES = {"bash": "looplock.bash", "zsh": "_looplock", "fish": "looplock.fish"}
SYNTAX_CHECK = {"bash": ["bash", "-n"], "zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}


def shell_env(home, **extra):
    """A user's environment, minus anything that would add search paths:
    HOME without dot files, no XDG_* variables (as on a server login)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(extra)
    return env


@pytest.mark.parametrize("shell", sorted(COMPLETION_SOURCES))
def test_completion_is_installed_and_parses(installed, completion_paths, shell):
    script = installed.dest / completion_paths[shell].relative_to("/")
    assert script.is_file(), f"no {script}"
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: cannot check the syntax of {script.name}")
    r = sh([*SYNTAX_CHECK[shell], str(script)])
    assert r.returncode == 0 and r.stderr == "", r.stderr


def require_searched(shell, directory, searched, build_options):
    """`directory` is among the directories `shell` searches; with a prefix
    other than /usr/local (the default) that depends on the user's setup."""
    if directory in searched:
        return
    prefix = build_options["prefix"]
    if prefix != "/usr/local":
        pytest.skip(f"prefix {prefix}: {shell} searches {directory} only if the user adds it "
                    f"(searched: {', '.join(map(str, searched))})")
    raise AssertionError(f"{shell} does not search {directory}: {searched}")


def test_zsh_searches_the_install_dir(completion_paths, build_options, tmp_path):
    """zsh's $fpath as a user's zsh starts (the system's zshenv included)
    holds the directory `meson install` puts _looplock in."""
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    r = sh(["zsh", "-c", "print -rl -- $fpath"], env=shell_env(tmp_path, ZDOTDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    require_searched("zsh", completion_paths["zsh"].parent, [Path(d) for d in r.stdout.splitlines()], build_options)


def test_fish_searches_the_install_dir(completion_paths, build_options, tmp_path):
    """fish's $fish_complete_path, without XDG_DATA_DIRS (fish then skips
    /usr/local/share/fish), holds the directory looplock.fish goes to."""
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    r = sh(["fish", "-c", 'printf "%s\\n" $fish_complete_path'], env=shell_env(tmp_path))
    assert r.returncode == 0, r.stderr
    require_searched("fish", completion_paths["fish"].parent, [Path(d) for d in r.stdout.splitlines()], build_options)


BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")


def test_bash_completion_loads_it_from_the_install_dir(installed, completion_paths, build_options, tmp_path):
    """bash-completion loads completions on demand from DATADIR/
    bash-completion/completions of every XDG_DATA_DIRS entry, by default
    /usr/local/share and /usr/share: its loader finds the installed file
    (here through XDG_DATA_DIRS naming the destdir's copy)."""
    if not BASH_COMPLETION.exists():
        pytest.skip("bash-completion is not installed (scripts/packages.txt lists it)")
    directory = completion_paths["bash"].parent
    assert directory.parts[-2:] == ("bash-completion", "completions"), directory
    if directory.parent.parent not in (Path("/usr/local/share"), Path("/usr/share")):
        require_searched("bash-completion", directory, [Path("/usr/local/share/bash-completion/completions"),
                                                        Path("/usr/share/bash-completion/completions")],
                         build_options)
    # The loader's default when XDG_DATA_DIRS is unset (as on a server login).
    r = sh(["bash", "--norc", "--noprofile", "-c", f". {BASH_COMPLETION}; declare -f __load_completion"],
           env=shell_env(tmp_path))
    assert "${XDG_DATA_DIRS:-/usr/local/share:/usr/share}" in r.stdout, r.stdout
    data_dir = installed.dest / directory.parent.parent.relative_to("/")
    prog = f". {BASH_COMPLETION}; __load_completion looplock && complete -p looplock"
    r = sh(["bash", "--norc", "--noprofile", "-c", prog], env=shell_env(tmp_path, XDG_DATA_DIRS=str(data_dir)))
    assert (r.returncode, r.stdout) == (0, "complete -F _looplock looplock\n"), r.stderr


def zsh_complete(fpath_dir, line, home, timeout=TIMEOUT):
    """What zsh's completion system offers for `line` (TAB at its end), in an
    interactive zsh on a pseudo-terminal, with `fpath_dir` first in $fpath and
    compinit run: (the matches, in order, and `$_comps[looplock]` with the
    file it autoloads from). The matches are caught on their way to compadd."""
    matches, lookup = home / "matches", home / "lookup"
    for f in (matches, lookup):
        f.unlink(missing_ok=True)
    (home / ".zshrc").write_text(f"""
PS1='' RPS1=''
fpath=({fpath_dir} $fpath)
autoload -Uz compinit && compinit -u -D
found=( ${{^fpath}}/_looplock(N) )
print -r -- "$_comps[looplock] $found[1]" > {lookup}
compadd() {{
  if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\\ * ]]; then builtin compadd "$@"; return; fi
  local -a hits
  builtin compadd -A hits "$@"
  (( $#hits )) && print -rl -- $hits >> {matches}
  builtin compadd "$@"
}}
_looplock_test_done() {{ print -r -- __DONE__ >> {matches}; }}
comppostfuncs=(_looplock_test_done)
print -r -- __READY__
""")
    pid, fd = pty.fork()
    if pid == 0:  # the child: zsh -d (no global zshrc: Debian's binds keys), .zshrc above
        try:
            os.execvpe("zsh", ["zsh", "-d", "-i"], shell_env(home, ZDOTDIR=str(home)))
        finally:
            os._exit(127)
    end = time.monotonic() + timeout
    seen = b""
    try:
        def read_some(wait):
            nonlocal seen
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                try:
                    seen += os.read(fd, 4096)
                except OSError:  # EIO: zsh has gone
                    return False
            return True

        while b"__READY__" not in seen:
            assert time.monotonic() < end and read_some(max(0.0, end - time.monotonic())), \
                f"zsh never got ready: {seen[-2000:]!r}"
        os.write(fd, line.encode() + b"\t")
        while not (matches.exists() and "__DONE__" in matches.read_text()):
            assert time.monotonic() < end and read_some(0.02), f"no completion for {line!r}: {seen[-2000:]!r}"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    found = []
    for m in matches.read_text().split("__DONE__")[0].split("\n"):
        if m and m not in found:
            found.append(m)
    return found, lookup.read_text().split()


def test_zsh_completion_completes(installed, completion_paths, tmp_path):
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    script = installed.dest / completion_paths["zsh"].relative_to("/")
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "loopdir").mkdir()
    (tmp_path / "loopfile").write_text("")
    loop = str(tmp_path / "loopdir")

    def complete(line):
        found, lookup = zsh_complete(script.parent, line, home)
        assert lookup == ["_looplock", str(script)], lookup  # compinit found this file for looplock
        return found

    assert complete("looplock --po") == ["--policy"]
    assert complete("looplock -qp ") == ["mutation", "monitor", "single_flight", "blocking", "coalesce"]
    assert complete("looplock --log-format j") == ["json"]
    assert complete(f"looplock -p blocking {tmp_path}/loop") == ["loopdir"]
    assert complete(f"looplock --metrics-dir {tmp_path}/loop") == ["loopdir"]
    assert set(complete(f"looplock {loop} ")) == {"--", "-c"}
    # --inspect takes no command: more DIRs, options, but neither -- nor -c.
    assert complete(f"looplock --inspect {loop} {tmp_path}/loop") == ["loopdir"]
    after_inspect = complete(f"looplock --inspect {loop} -")
    assert "--json" in after_inspect and "-c" not in after_inspect and "--" not in after_inspect
    assert complete(f"looplock --inspect {loop} -- ") == []


def test_fish_completion_completes(installed, completion_paths, tmp_path):
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    script = installed.dest / completion_paths["fish"].relative_to("/")
    (tmp_path / "loopdir").mkdir()
    (tmp_path / "loopfile").write_text("")
    loop = str(tmp_path / "loopdir")

    # fish loads a command's completions only when the command is on PATH.
    path = f"{installed('bindir')}:/usr/bin:/bin"

    def complete(line):
        # Autoloaded from the directory, as fish finds it, not sourced.
        prog = f"set -p fish_complete_path {script.parent}; complete -C{line!r}"
        r = sh(["fish", "-c", prog], env=shell_env(tmp_path, PATH=path))
        assert r.returncode == 0, r.stderr
        return [w.split("\t")[0] for w in r.stdout.splitlines()]

    assert complete("looplock --pol") == ["--policy"]
    assert complete("looplock -p s") == ["single_flight"]
    assert sorted(complete("looplock -qp ")) == ["blocking", "coalesce", "monitor", "mutation", "single_flight"]
    assert complete("looplock --log-format j") == ["json"]
    assert complete(f"looplock --metrics-dir {tmp_path}/loop") == [f"{loop}/"]
    assert sorted(complete(f"looplock {loop} ")) == ["--", "-c"]
    assert complete(f"looplock --inspect {loop} {tmp_path}/loop") == [f"{loop}/"]
    after_inspect = complete(f"looplock --inspect {loop} -")
    assert "--json" in after_inspect and "-c" not in after_inspect and "--" not in after_inspect


def bash_complete(script, words):
    """COMPREPLY of looplock's bash completion for the command line `words`
    (the last word is the one being completed)."""
    prog = (
        'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
        'COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=(); _looplock; '
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    r = sh(["bash", "--norc", "--noprofile", "-c", prog, "bash", str(script), *words])
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.split("\n") if w]


def test_bash_completion_completes(installed, completion_paths, tmp_path):
    script = installed.dest / completion_paths["bash"].relative_to("/")
    assert bash_complete(script, ["looplock", "--pol"]) == ["--policy"]
    assert bash_complete(script, ["looplock", "-p", "s"]) == ["single_flight"]
    policies = ["blocking", "coalesce", "monitor", "mutation", "single_flight"]
    assert sorted(bash_complete(script, ["looplock", "--policy", ""])) == policies
    assert sorted(bash_complete(script, ["looplock", "-qp", ""])) == policies  # a group ending in -p
    assert bash_complete(script, ["looplock", "-qpsi"]) == ["-qpsingle_flight"]
    assert bash_complete(script, ["looplock", "--log-format", "j"]) == ["json"]
    assert bash_complete(script, ["looplock", "-w", ""]) == []  # a number: nothing to offer
    assert bash_complete(script, ["looplock", "-qw", ""]) == []
    # DIR is a directory (files are not offered).
    (tmp_path / "loopdir").mkdir()
    (tmp_path / "loopfile").write_text("")
    loop = str(tmp_path / "loopdir")
    assert bash_complete(script, ["looplock", "-p", "blocking", str(tmp_path / "loop")]) == [loop]
    assert bash_complete(script, ["looplock", "-qp", "blocking", str(tmp_path / "loop")]) == [loop]
    assert bash_complete(script, ["looplock", "--metrics-dir", str(tmp_path / "loop")]) == [loop]
    # After DIR: "--" or -c.
    assert sorted(bash_complete(script, ["looplock", str(tmp_path), ""])) == ["--", "-c"]
    assert sorted(bash_complete(script, ["looplock", "-qp", "mutation", str(tmp_path), ""])) == ["--", "-c"]
    # --inspect takes no command: more DIRs, and options without -- and -c.
    assert bash_complete(script, ["looplock", "--inspect", loop, str(tmp_path / "loop")]) == [loop]
    after_inspect = bash_complete(script, ["looplock", "--inspect", loop, "-"])
    assert "--json" in after_inspect and "-c" not in after_inspect and "--" not in after_inspect
    assert bash_complete(script, ["looplock", "--inspect", loop, "--", ""]) == []
    # After "--": a command (here: the shell running the test surely exists).
    assert "bash" in bash_complete(script, ["looplock", str(tmp_path), "--", "bas"])
    assert "--policy" not in bash_complete(script, ["looplock", str(tmp_path), "--", "sh", "--pol"])


# -- help, man page and completions agree ------------------------------------


def test_help_long_options_are_in_the_man_page():
    longs, _ = help_options()
    assert {"--policy", "--inspect", "--help", "--version"} <= longs  # the parse works
    section = man_options_section()
    missing = [o for o in sorted(longs) if f"*{o}*" not in section]
    assert missing == [], f"in --help but not in the man page's OPTIONS: {missing}"


def test_man_page_long_options_are_in_help():
    documented = set(re.findall(r"\*(--[a-z][a-z-]*)\*", man_options_section()))
    assert {"--policy", "--stale-after"} <= documented  # the parse works
    longs, _ = help_options()
    extra = sorted(documented - longs)
    assert extra == [], f"in the man page's OPTIONS but not in --help: {extra}"


def completion_options(name):
    """The options a completion file offers: (long, short)."""
    text = (COMPLETIONS / name).read_text()
    if name == "looplock.fish":  # complete -c looplock -n ... -s p -l policy ...
        lines = "\n".join(line for line in text.splitlines() if line.startswith("complete -c looplock "))
        longs = {"--" + o for o in re.findall(r"(?<![\w-])-l ([a-z][a-z-]*)", lines)}
        shorts = {"-" + o for o in re.findall(r"(?<![\w-])-s ([A-Za-z])\b", lines)}
    elif name == "_looplock":  # '(...)'{-p+,--policy=}'[...]', '--skip-exit-code=[...]', '(-c)--inspect[...]'
        specs = re.findall(r"(?:[{,']|\)')?(--?[A-Za-z][a-z-]*)[+=]?(?=[,}]|\[)", text)
        longs = {s for s in specs if s.startswith("--")}
        shorts = {s for s in specs if not s.startswith("--")}
    else:  # the words after "local opts=" and in "opts+="
        m = re.search(r"local opts='([^']*)'", text)
        words = m.group(1).split() + re.search(r"opts\+=' ([^']*)'", text).group(1).split()
        longs = {w for w in words if w.startswith("--") and w != "--"}
        shorts = {w for w in words if re.fullmatch(r"-[A-Za-z]", w)}
    return longs, shorts


@pytest.mark.parametrize("shell,name", [("bash", "looplock.bash"), ("zsh", "_looplock"), ("fish", "looplock.fish")])
def test_the_committed_completions_are_what_looplock_completions_prints(shell, name):
    """completions/ holds `looplock --completions SHELL`, made from the
    option table (cross and package builds install it without running the
    binary): regenerate it with scripts/completions after changing an option."""
    r = run(["--completions", shell])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == (COMPLETIONS / name).read_text(), f"completions/{name} is stale: run scripts/completions"


def test_completions_of_another_shell_is_a_usage_error():
    r = run(["--completions", "ksh"])
    assert r.returncode == 64 and "invalid --completions 'ksh': expected bash, zsh or fish" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["looplock.bash", "_looplock", "looplock.fish"])
def test_completions_know_every_option(name):
    text = (COMPLETIONS / name).read_text()
    longs, shorts = help_options()
    shorts.add("-c")
    offered_longs, offered_shorts = completion_options(name)
    assert {"--policy", "--inspect"} <= offered_longs and {"-p", "-c"} <= offered_shorts  # the parse works
    missing = sorted((longs - offered_longs) | (shorts - offered_shorts))
    assert missing == [], f"{name} does not complete {missing}"
    unknown = sorted((offered_longs - longs) | (offered_shorts - shorts))
    assert unknown == [], f"{name} offers options that --help does not list: {unknown}"
    for policy in ("mutation", "monitor", "single_flight", "blocking", "text", "json"):
        assert policy in text


def help_value_options():
    """The options --help shows with a value ("-p, --policy NAME")."""
    text = help_text().split("\nExamples:")[0]
    out = set()
    for shorts, long_opt in re.findall(r"^ +((?:-[A-Za-z], )?)(--[a-z-]+) [A-Z]", text, re.M):
        out.add(long_opt)
        if shorts:
            out.add(shorts[:2])
    return out


@pytest.mark.parametrize("name,pattern", [("looplock.bash", r"_looplock_value_opts='([^']*)'"),
                                          ("looplock.fish", r"set -g __looplock_value_opts ((?:.*\\\n)*.*)")])
def test_completions_skip_the_value_of_every_value_option(name, pattern):
    """The completions find DIR by skipping option values: their lists of
    options that take one cover every such option of --help."""
    value_opts = set(re.search(pattern, (COMPLETIONS / name).read_text()).group(1).replace("\\", " ").split())
    assert {"--policy", "-p", "--ttl"} <= help_value_options()  # the parse works
    missing = sorted(help_value_options() - value_opts)
    assert missing == [], f"{name} does not know that these take a value: {missing}"
