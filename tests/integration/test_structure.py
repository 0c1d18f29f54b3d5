"""The shape of src/, checked: one folder per subsystem in layers, each
folder including only the layers below it (and never a peer of its own
layer), includes path-qualified from src/, a module graph without cycles (a
module is X.hpp with X.cpp; an edge from X to Y when either includes Y.hpp),
no function over 90 lines, a thin top (cli/app.cpp), every folder and module
in the layout of docs/HACKING.md, and words that point only inside the
repository.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
MAX_FUNCTION_LINES = 90

# The layers of src/, from the bottom up; folders in one layer are peers and
# include neither each other nor anything above them. docs/HACKING.md's Layout says
# what each owns; src/meson.build lists the folders in this order.
LAYERS = [
    ["os"],
    ["base"],
    ["job"],
    ["settings"],
    ["records"],
    ["lock"],
    ["local", "cluster"],
    ["run"],
    ["cli"],
]
LAYER_OF = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
# src/os/'s subfolders: each system's code for the interface in src/os/.
SYSTEMS = ("posix", "windows")
# Generated in the build tree from a template beside it.
GENERATED = {"cli/commit.h": "cli/commit.h.in"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

def sources():
    return sorted(f for f in SRC.rglob("*") if f.suffix in (".hpp", ".cpp", ".h"))

def folder_of(path):
    return path.relative_to(SRC).parts[0]

def layering_violations(includes):
    """`includes`: (including folder, included "folder/file") pairs. Returns
    what breaks the layering: an include that is not path-qualified into a
    known folder, or that reaches a peer or a layer above."""
    bad = []
    for folder, target in includes:
        parts = target.split("/")
        if len(parts) == 3 and parts[0] == "os" and parts[1] in SYSTEMS:
            parts = ["os", parts[2]]  # a system's own header in src/os/: still reaches the system
        if len(parts) != 2 or parts[0] not in LAYER_OF:
            bad.append(f"{folder}: \"{target}\" is not path-qualified from src/ into a folder")
        elif parts[0] != folder and LAYER_OF[parts[0]] >= LAYER_OF[folder]:
            side = "a peer" if LAYER_OF[parts[0]] == LAYER_OF[folder] else "a layer above"
            bad.append(f"{folder}: includes \"{target}\", {side}")
    return bad

def project_includes():
    """(file, including folder, included path) for every quoted include."""
    for f in sources():
        for target in INCLUDE.findall(f.read_text()):
            yield f, folder_of(f), target

def modules():
    mods = {}
    for f in sources():
        mods.setdefault(f"{folder_of(f)}/{f.name.split('.')[0]}", []).append(f)
    return mods

def module_graph():
    mods = modules()
    edges = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            for inc in INCLUDE.findall(f.read_text()):
                dep = inc.rsplit(".", 1)[0]
                if inc.endswith(".hpp") and dep != m and dep in mods:
                    edges[m].add(dep)
    return edges

def cycles(edges):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out

def blank_literals(text):
    """`text` with comments, string and character literals blanked out
    (newlines kept), so that braces in them do not count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and re.match(r'R"([^(\s]*)\(', text[i:]):
            delim = re.match(r'R"([^(\s]*)\(', text[i:]).group(1)
            end = text.find(")" + delim + '"', i)
            j = n if end < 0 else end + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
            out.append(c)  # a digit separator (1'000), not a character literal
            i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)

CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try|return)\b")

def functions(path):
    """(name, first line, line count) of every function body in a file."""
    text = blank_literals(path.read_text())
    found = []

    def matching(at):
        depth = 0
        for j in range(at, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return j
        return len(text) - 1

    def scan(start, end):
        i = start
        carried = None  # the header's start, inside a constructor's initializer list
        while i < end:
            if text[i] != "{":
                i += 1
                continue
            # The header: back to the previous statement or block boundary.
            h = max(start, max(text.rfind(";", start, i), text.rfind("{", start, i), text.rfind("}", start, i)) + 1)
            if carried is not None:
                h, carried = carried, None
            header = text[h:i].strip()
            close = matching(i)
            after = text[close + 1:close + 200].lstrip()[:1]
            if re.search(r"\)\s*:\s*[^;]*$", header) and after in (",", "{"):
                carried = h  # a member's braced initializer: the body is still to come
                i = close + 1
                continue
            is_function = ("(" in header and header.rstrip().endswith((")", "const", "override", "noexcept", "final"))
                           or re.search(r"\)\s*:\s*[\w:]+[({]", header)) and not CONTROL.match(header) \
                and "=" not in header.split("(")[0] and "[" not in header.split("(")[0]
            if is_function:
                first = text.count("\n", 0, h + len(text[h:i]) - len(text[h:i].lstrip()))
                lines = text.count("\n", 0, close) - first + 1
                found.append((header.split("(")[0].split()[-1] if header.split("(")[0].split() else header,
                              first + 1, lines))
                i = close + 1
            elif "=" in header or "(" in header:
                i = close + 1  # an initializer, a lambda or a control block outside a function: not descended
            else:
                scan(i + 1, close)  # a namespace, class or struct: look inside
                i = close + 1

    scan(0, len(text))
    return found

def test_every_source_is_in_a_folder_of_the_layers():
    loose = [f.name for f in SRC.iterdir() if f.is_file() and f.name not in ("meson.build", "posix_bound.txt")]
    assert loose == [], f"files of src/ outside its folders: {loose}"
    folders = sorted(d.name for d in SRC.iterdir() if d.is_dir())
    assert folders == sorted(LAYER_OF), folders
    for folder in folders:
        assert (SRC / folder / "meson.build").is_file(), f"src/{folder} has no meson.build"

def test_src_meson_build_lists_the_folders_in_layer_order():
    build = (SRC / "meson.build").read_text()
    listed = re.findall(r"'([a-z]+)'", re.search(r"foreach folder : \[([^\]]*)\]", build).group(1))
    assert listed == [f for layer in LAYERS for f in layer]

def test_no_folder_includes_a_peer_or_a_layer_above():
    pairs = [(folder, target) for _, folder, target in project_includes()]
    assert len(pairs) > 200 and ("cli", "run/run.hpp") in pairs  # the reading works
    assert layering_violations(pairs) == []

def test_every_include_names_a_file_of_the_repository():
    missing = [f"{f.relative_to(SRC)}: {t}" for f, _, t in project_includes()
               if not (SRC / GENERATED.get(t, t)).is_file()]
    assert missing == []

def test_the_layering_check_finds_what_breaks_it():
    """A check that cannot fail is a defect: each kind of break is found."""
    assert layering_violations([("run", "lock/lock.hpp"), ("cli", "base/text.hpp"), ("os", "os/sys.hpp"),
                                ("job", "os/posix/interrupts.hpp")]) == []
    found = layering_violations([("base", "cli/options.hpp"), ("local", "cluster/cluster.hpp"),
                                 ("run", "text.hpp"), ("run", "nowhere/x.hpp"), ("run", "os/other/x.hpp")])
    assert len(found) == 5
    assert "a layer above" in found[0] and "a peer" in found[1]
    assert "not path-qualified" in found[2] and "not path-qualified" in found[3]

def test_the_module_graph_has_no_cycle():
    edges = module_graph()
    assert len(edges) > 20 and "cli/app" in edges and "os/sys" in edges  # the reading works
    assert "run/run" in edges["cli/app"]
    assert cycles(edges) == []

def test_the_checker_finds_a_cycle():
    """A check that cannot fail is a defect: a made-up cycle is found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]

def test_no_function_in_src_is_over_90_lines():
    long = []
    for f in sources():
        for name, line, count in functions(f):
            if count > MAX_FUNCTION_LINES:
                long.append(f"{f.relative_to(SRC)}:{line}: {name}: {count} lines")
    assert long == [], long

def balanced(text, start):
    """The code from `start` (just after an opening brace) to its closing
    brace (`text`: blank_literals')."""
    depth, i = 1, start
    while depth and i < len(text):
        depth += (text[i] == "{") - (text[i] == "}")
        i += 1
    return text[start:i - 1]

def top_level_commas(text):
    depth, count = 0, 0
    for c in text:
        depth += (c in "{([") - (c in "})]")
        count += c == "," and depth == 0
    return count

def wide_structs(texts):
    """The structs of more than three data members, by name."""
    wide = set()
    for text in map(blank_literals, texts):
        for m in re.finditer(r"\bstruct\s+(\w+)\s*(?:final\s*)?(?::[^;{]*)?\{", text):
            body = balanced(text, m.end())
            top, depth = "", 0
            for c in body:
                depth += c == "{"
                if depth == 0:
                    top += c
                depth -= c == "}"
            members = [s for s in top.split(";") if s.strip() and "(" not in s.split("=")[0]
                       and not re.match(r"\s*(using|static|enum|friend|struct|public|private)\b", s)]
            if len(members) > 3:
                wide.add(m.group(1))
    return wide

def positional_inits(texts, wide):
    """`Name{a, b, ...}` or `Name x{a, b, ...}` of a wide struct, by position."""
    found = []
    for path, text in texts.items():
        text = blank_literals(text)
        for m in re.finditer(r"\b(\w+)(?:\s+\w+)?\s*\{", text):
            if m.group(1) not in wide:
                continue
            inner = balanced(text, m.end()).strip()
            if inner and not inner.startswith(".") and top_level_commas(inner) >= 1:
                found.append(f"{path}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}")
    return found

def test_wide_structs_are_built_with_designated_initializers():
    """A struct of more than three fields is never built by position, in
    src/ or the unit tests: inserting a field must not shift values
    silently. (Named initializations; a `return {...}` is read by eye.)"""
    files = list(sources()) + sorted((ROOT / "tests" / "unit").glob("*.[ch]pp"))
    texts = {str(f.relative_to(ROOT)): f.read_text() for f in files}
    wide = wide_structs(texts.values())
    assert {"HolderRecord", "JobEnd", "Incident"} <= wide  # the reading works
    assert positional_inits(texts, wide) == []

def test_the_initializer_check_finds_a_positional_one():
    text = "struct P {\n  int a = 0;  // it's\n  int b;\n  std::string c;  // x\n  bool d = false;\n  void f();\n};\n"
    use = 'P p{1, 2\'000, "x,{y", true};\nP q{.a = 1, .b = 2, .c = "}"};\nP r{};\n'
    assert wide_structs([text]) == {"P"}
    assert wide_structs(["struct Q {\n  int a;  // it's\n  int b;\n  int c;\n};\n"]) == set()
    assert positional_inits({"s.cpp": text + use}, {"P"}) == ["s.cpp:8: P p{"]

def test_the_function_finder_sees_functions(tmp_path):
    """Its reading of C++ is checked on a sample: methods, constructors with
    initializer lists, a brace in a string, a lambda inside a body."""
    body = "\n".join(f"  x += {i};" for i in range(100))
    sample = tmp_path / "s.cpp"
    sample.write_text("namespace n {\nstruct S {\n  void m() const {\n" + body + "\n  }\n};\n"
                      "S::S(int a) : a_(a), b_{a} {\n  const char* s = \"{\";\n  auto f = [&](int y) { return y; };\n}\n"
                      "int f(int x) {\n  return x + 1'000'000;\n}\n}  // namespace n\n")
    found = {name: count for name, _, count in functions(sample)}
    assert found["m"] == 102
    assert found["S::S"] == 4
    assert found["f"] == 3

def test_the_top_is_thin():
    assert len((SRC / "cli" / "app.cpp").read_text().splitlines()) < 420
    main = (SRC / "cli" / "main.cpp").read_text()
    assert len(main.splitlines()) < 10

HACKING = ROOT / "docs" / "HACKING.md"  # the developers' document: its Layout


def test_the_hacking_layout_lists_every_folder_and_module():
    hacking = HACKING.read_text()
    layout = hacking[hacking.index("## Layout"):]
    folders = [f for f in LAYER_OF if not re.search(rf"^src/{f}/ ", layout, re.M)]
    assert folders == [], f"folders the layout of docs/HACKING.md does not list: {folders}"
    # A folder's modules are listed, indented, below its line.
    listed, folder = set(), None
    for line in layout.splitlines():
        if m := re.match(r"^src/([a-z]+)/ ", line):
            folder = m.group(1)
        elif (m := re.match(r"^  (?:posix/|windows/)?([a-z_]+)\.", line)) and folder:
            listed.add(f"{folder}/{m.group(1)}")
        elif line and not line.startswith(" "):
            folder = None
    missing = sorted(set(modules()) - listed)
    assert missing == [], f"modules the layout of docs/HACKING.md does not list below their folder: {missing}"

def test_the_sources_cite_only_the_repository():
    """No reference to a contract file that is not in the repository."""
    offenders = []
    for d in ("src", "tests", "man", "scripts", "examples", "docs", "debian", "completions"):
        for f in (ROOT / d).rglob("*"):
            if f.is_file() and f.suffix not in (".png",) and "corpus" not in f.parts:
                try:
                    text = f.read_text()
                except UnicodeDecodeError:
                    continue
                if re.search(r"\bSPEC\b", text) and f.name != "test_structure.py":
                    offenders.append(str(f.relative_to(ROOT)))
    if re.search(r"\bSPEC\b", (ROOT / "README.md").read_text()):
        offenders.append("README.md")
    assert offenders == []

# What the cluster lock's code is called: none of it is in looplock, which
# execs looplock-etcd for --etcd (docs/HACKING.md, Layout: src/cluster/ is a
# library of its own). Endpoint parsing stays, for looplock's usage checks.
CLUSTER_SYMBOL = re.compile(r"looplock::(etcd::Client\b|etcd::Transport\b|etcd::CurlTransport\b|ClusterLock\b|"
                            r"EtcdLock\b|EtcdKind\b)")

def cluster_symbols(executable):
    if not shutil.which("nm"):
        pytest.skip("nm(1) is needed")
    out = subprocess.run(["nm", "-C", str(executable)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"nm cannot read {executable}: {out.stderr.strip()}")
    assert "main_program" in out.stdout, "nm listed no symbols (a stripped binary cannot be checked)"
    return sorted({m.group(1) for m in CLUSTER_SYMBOL.finditer(out.stdout)})

def test_looplock_holds_no_cluster_lock_code():
    from conftest import LOOPLOCK
    assert cluster_symbols(LOOPLOCK) == []
    helper = Path(LOOPLOCK).parent / "looplock-etcd"
    if helper.exists():  # the reading works: looplock-etcd has them all
        assert {"etcd::Client", "ClusterLock", "EtcdLock", "EtcdKind"} <= set(cluster_symbols(helper))

# --- the operating system behind src/os/ --------------------------------------
# Outside src/os/, a file may include only the C++ standard library's
# headers, the project's own and its declared libraries' (nlohmann-json,
# cxxopts; libcurl in the transport that looplock-etcd alone links), and
# read nothing under /proc. <csignal> is not on the list: Windows has it, but
# no SIGUSR1. src/posix_bound.txt lists the files outside src/os/ that still
# reach the system, themselves or through a header they include (of any
# folder, src/os/ included: its headers are to be the portable interface):
# the Windows cross build leaves their .cpp files out (src/meson.build), the
# list may only shrink, and a file that no longer reaches the system must
# leave it.
STD_HEADERS = set("""
    algorithm any array atomic bit bitset cassert cctype cerrno cfloat charconv chrono cinttypes climits clocale cmath
    compare concepts condition_variable cstdarg cstddef cstdint cstdio cstdlib cstring ctime cwchar deque exception
    filesystem format fstream functional initializer_list iomanip ios iosfwd iostream istream iterator limits list
    locale map memory mutex new numeric optional ostream queue random ranges ratio regex set source_location span
    sstream stack stdexcept streambuf string string_view system_error thread tuple type_traits typeinfo
    unordered_map unordered_set utility variant vector""".split())
LIBRARY_HEADERS = {"nlohmann/json.hpp", "cxxopts.hpp"}
TRANSPORT_HEADERS = {"curl/curl.h"}  # src/cluster/etcd_curl.*: looplock-etcd only, never built for Windows
POSIX_BOUND = SRC / "posix_bound.txt"
# POSIX calls that the C++ standard's headers let through on Linux (<ctime>,
# <cstdlib>, <cstdio>): a file that calls one reaches the system as surely
# as one that includes <unistd.h>.
POSIX_CALL = re.compile(r"\b(nanosleep|clock_gettime|clock_nanosleep|gmtime_r|localtime_r|timegm|realpath|mkstemp|"
                        r"mkdtemp|setenv|unsetenv|fileno|popen|fdopen|getpid|getppid|getuid|geteuid|getgid|getegid|"
                        r"getgroups|isatty|pread|pwrite|ftruncate|fsync|fdatasync)\s*\(")

def system_use(path):
    """The headers outside the allow-list that `path` includes (and the POSIX
    calls it makes through allowed ones, as "name()"), and whether it reads /proc."""
    text = path.read_text()
    allowed = STD_HEADERS | LIBRARY_HEADERS | (TRANSPORT_HEADERS if path.stem == "etcd_curl" else set())
    headers = sorted({h for h in re.findall(r"^\s*#\s*include\s*<([^>]+)>", text, re.M) if h not in allowed})
    code = re.sub(r"//[^\n]*", "", text)
    calls = sorted({m + "()" for m in POSIX_CALL.findall(code)})
    return headers + calls, '"/proc' in text

def source_graph():
    """src/'s files: name -> (reaches the system itself, the project headers it includes)."""
    files = {str(f.relative_to(SRC)): (any(system_use(f)) or system_own(f), INCLUDE.findall(f.read_text()))
             for f in sources()}
    return files

def system_own(path):
    """Whether `path` is one system's own code in src/os/ (posix/, windows/):
    a file that includes one of those headers builds for that system alone."""
    parts = path.relative_to(SRC).parts
    return len(parts) == 3 and parts[0] == "os" and parts[1] in SYSTEMS

def reaching(files):
    """`files`: name -> (reaches the system itself, the project headers it
    includes). The names that reach the system themselves or through an
    include, however deep."""
    bound = {name for name, (itself, _) in files.items() if itself}
    grown = True
    while grown:
        more = {name for name, (_, includes) in files.items() if name not in bound and set(includes) & bound}
        bound |= more
        grown = bool(more)
    return bound

def listed_bound():
    lines = POSIX_BOUND.read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}

def test_the_operating_system_is_reached_only_where_it_is_today():
    bound = {name for name in reaching(source_graph()) if not name.startswith("os/")}
    assert "cluster/etcd_curl.cpp" in bound  # the reading works (test_the_system_check_sees_headers_and_proc: /proc)
    joined = sorted(bound - listed_bound())
    assert joined == [], f"files outside src/os/ that now reach the system (go through src/os/): {joined}"
    left = sorted(listed_bound() - bound)
    assert left == [], f"files that no longer reach the system: remove them from src/posix_bound.txt: {left}"

def test_the_system_check_sees_headers_and_proc(tmp_path):
    sample = tmp_path / "x.cpp"
    sample.write_text('#include <string>\n#include <csignal>\n#include <nlohmann/json.hpp>\n'
                      '#include <sys/stat.h>\nauto p = "/proc/self/stat";\nvoid f() { nanosleep(&ts, nullptr); }\n'
                      '// realpath(3) in a comment is no call\n')
    assert system_use(sample) == (["csignal", "sys/stat.h", "nanosleep()"], True)
    sample.write_text("#include <vector>\n#include <cxxopts.hpp>\n")
    assert system_use(sample) == ([], False)
    assert system_own(SRC / "os" / "posix" / "procfs.hpp") and system_own(SRC / "os" / "windows" / "sys.cpp")
    assert not system_own(SRC / "os" / "process.hpp")

def test_reaching_follows_includes_however_deep():
    files = {"a.cpp": (False, ["b.hpp"]), "b.hpp": (False, ["c.hpp"]), "c.hpp": (True, []), "d.cpp": (False, ["e.hpp"]),
             "e.hpp": (False, [])}
    assert reaching(files) == {"a.cpp", "b.hpp", "c.hpp"}

def test_the_windows_unit_tests_reach_no_system():
    meson = (ROOT / "tests" / "unit" / "meson.build").read_text()
    names = re.findall(r"'(\w+)'", re.search(r"portable_unit_tests = \[(.*?)\]", meson, re.S).group(1))
    assert "text" in names
    bound = listed_bound()
    files = source_graph()
    for helper in (ROOT / "tests" / "unit").glob("*.hpp"):  # testutil.hpp, samples.hpp: included by name
        headers, proc = system_use(helper)
        files[helper.name] = (proc or headers not in ([], ["doctest/doctest.h"]), INCLUDE.findall(helper.read_text()))
    assert "testutil.hpp" in reaching(files) and "samples.hpp" not in reaching(files)  # the reading works
    for name in names + ["main"]:  # test_main.cpp: doctest's main()
        test = ROOT / "tests" / "unit" / f"test_{name}.cpp"
        headers, proc = system_use(test)
        files[test.name] = (proc or headers not in ([], ["doctest/doctest.h"]), INCLUDE.findall(test.read_text()))
        assert test.name not in reaching(files), f"{test.name} reaches the system: {headers}"
        for module in (f"{folder}/{name}.cpp" for folder in LAYER_OF if name != "main"):
            assert module not in bound, f"test_{name} tests {module}, which Windows does not build yet"
