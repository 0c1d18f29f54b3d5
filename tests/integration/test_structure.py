"""The shape of src/, checked: a module graph without cycles (a module is
X.hpp with X.cpp; an edge from X to Y when either includes Y.hpp), no
function over 90 lines, a thin top (app.cpp), every module in the README's
layout, and words that point only inside the repository.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
MAX_FUNCTION_LINES = 90


def modules():
    mods = {}
    for f in sorted(SRC.iterdir()):
        if f.suffix in (".hpp", ".cpp", ".h"):
            mods.setdefault(f.stem, []).append(f)
    return mods


def module_graph():
    mods = modules()
    edges = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            for inc in re.findall(r'#include "([^"]+)\.hpp"', f.read_text()):
                if inc != m and inc in mods:
                    edges[m].add(inc)
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


def test_the_module_graph_has_no_cycle():
    edges = module_graph()
    assert len(edges) > 20 and "app" in edges and "sys" in edges  # the reading works
    assert cycles(edges) == []


def test_the_checker_finds_a_cycle():
    """A check that cannot fail is a defect: a made-up cycle is found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_function_in_src_is_over_90_lines():
    long = []
    for f in sorted(SRC.glob("*.[ch]pp")):
        for name, line, count in functions(f):
            if count > MAX_FUNCTION_LINES:
                long.append(f"{f.name}:{line}: {name}: {count} lines")
    assert long == [], long


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
    assert len((SRC / "app.cpp").read_text().splitlines()) < 420
    main = (SRC / "main.cpp").read_text()
    assert len(main.splitlines()) < 10


def test_the_readme_layout_lists_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    missing = [m for m in modules() if not re.search(rf"^src/{re.escape(m)}\.", layout, re.M)]
    assert missing == [], f"modules the README's layout does not list: {missing}"


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
