"""The packages depend one way: wim <- data_gen <- training (docs/design.md, "Layout"), and
no module imports itself through others (no import cycle).

Every import counts, the ones inside functions included: a lazy import is still an arrow.
The one exemption: wim/cli/, the entry point and the command layer at the top (one function per
command in its `COMMANDS` table); no other module may reach up.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from wim.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wim", "data_gen", "training")
# What each package may not import.
FORBIDDEN = {"wim": ("data_gen", "training"), "data_gen": ("training",), "training": ()}
ENTRY_POINT = Path("wim/cli")


def imported_packages(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in the module, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports() -> list[str]:
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.is_relative_to(ENTRY_POINT):
                continue
            for line, target in imported_packages(path.read_text()):
                if target in FORBIDDEN[package]:
                    bad.append(f"{rel}:{line} imports {target}")
    return bad


def test_no_module_imports_a_layer_above_it():
    assert upward_imports() == []


@pytest.mark.parametrize("source", ["def f():\n    from training.dpo import x\n",
                                    "import training.online\n",
                                    "class A:\n    def m(self):\n        import training\n"])
def test_the_scan_sees_imports_at_any_depth(source):
    assert [t for _, t in imported_packages(source)] == ["training"]


def module_name(rel: Path) -> str:
    """wim/report/build.py -> wim.report.build; wim/report/__init__.py -> wim.report."""
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, modules: set[str],
                     is_package: bool = False) -> set[str]:
    """The modules of `modules` that `module` imports, at any depth. `from a import b` counts
    a.b when b is a module, else a. A package's `__init__`, which Python runs before any module
    in it, is not counted for `import a.b`: that is what a package is, not a cycle."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the module's package, one level up per further dot
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                      for a in node.names}
    return (found & modules) - {module}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (strongly connected
    components of more than one module, Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of wim, data_gen and training it imports}."""
    paths = {module_name(p.relative_to(ROOT)): p
             for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {m: imported_modules(p.read_text(), m, set(paths), p.name == "__init__.py")
            for m, p in paths.items()}


def test_no_import_cycle():
    graph = import_graph()
    assert "data_gen.validity_table" in graph["data_gen.agreement"]  # the scan sees modules
    assert [[f"{m} -> {sorted(graph[m] & set(c))}" for m in c]
            for c in import_cycles(graph)] == []


def test_the_cycle_scan_finds_a_circle_and_only_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({**graph, "c": set()}) == []


@pytest.mark.parametrize("source", ["def f():\n    from p.b import x\n",
                                    "from p import b\n",
                                    "class A:\n    def m(self):\n        import p.b\n",
                                    "from . import b\n", "from .b import x\n"])
def test_the_cycle_scan_sees_module_imports_at_any_depth(source):
    assert imported_modules(source, "p.a", {"p", "p.a", "p.b", "p.c"}) == {"p.b"}


def test_the_cycle_scan_counts_a_package_for_the_names_it_defines():
    modules = {"p", "p.a", "p.b"}
    assert imported_modules("from p import b, name\n", "p.a", modules) == {"p", "p.b"}
    assert imported_modules("from . import name\n", "p.b", modules) == {"p"}
    assert imported_modules("from .a import x\n", "p", modules, is_package=True) == {"p.a"}


def test_the_report_is_a_package_of_the_core_library():
    from wim.report import write_report

    assert write_report.__module__.startswith("wim.report.")
    assert not (ROOT / "training" / "report.py").exists()


def test_the_config_imports_nothing_it_configures():
    """wim/config sits below every feature: the features import their choices from it (e.g.
    precision's DTYPES, refine's CRITERIA), never the other way, so loading a config runs no
    feature code."""
    graph = import_graph()
    config = {m for m in graph if m == "wim.config" or m.startswith("wim.config.")}
    outside = {m: sorted(t for t in graph[m] if t not in config and t != "wim.errors")
               for m in config}
    assert {m: t for m, t in outside.items() if t} == {}


def test_every_parsed_command_is_one_entry_of_the_command_table():
    """wim/cli/parser.py parses; each command it parses runs through `COMMANDS`, and nothing
    else; and nothing outside wim/cli/ imports the command layer."""
    import argparse

    from wim.cli import COMMANDS, build_parser, command
    from wim.cli.parser import stage_commands

    def names(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
        found = set()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found |= names(sub, f"{prefix}{name} ") or {prefix + name}
        return found

    parsed = names(build_parser())
    assert parsed == set(COMMANDS) | {"run", *stage_commands()}
    assert all(callable(command(name)) for name in parsed)
    graph = import_graph()
    users = {m for m, targets in graph.items() if not m.startswith("wim.cli")
             and any(t == "wim.cli" or t.startswith("wim.cli.") for t in targets)}
    assert users <= {"wim.__main__"}


CODE_LINES_CAP = 400


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring (any string
    that stands alone as a statement: a module's, a class's, a function's or an attribute's)."""
    prose = {line for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str)
             for line in range(node.lineno, node.end_lineno + 1)}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    code = {line for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type not in skip for line in range(tok.start[0], tok.end[0] + 1)}
    return len(code - prose)


def modules_over_the_cap(paths) -> list[str]:
    return [f"{p}: {n}" for p in paths if (n := code_lines(p.read_text())) > CODE_LINES_CAP]


def test_no_module_has_over_400_code_lines():
    """A module whose code grows past 400 lines holds parts with names of their own: split them.
    Its contract stays in its docstring: docstrings, comments and blank lines are not counted."""
    paths = [p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert len(paths) > 100
    assert modules_over_the_cap(sorted(ROOT / p for p in paths)) == []


def test_the_code_line_count_skips_prose_and_catches_401_lines_of_code(tmp_path):
    prose = '"""A module.\n\nIts contract, at length.\n"""\n# why\n\n'
    doc = 'def f():\n    """Docs\n    over lines."""\n    return """not\n    a docstring"""\n'
    assert code_lines(prose + doc) == 3  # def, and the returned string's two lines
    lines = "".join(f"x{i} = {i}  # a comment\n" for i in range(CODE_LINES_CAP))
    under, over = tmp_path / "under.py", tmp_path / "over.py"
    under.write_text(prose * 50 + lines)
    over.write_text(prose + lines + "one_more = 1\n")
    assert modules_over_the_cap([under, over]) == [f"{over}: {CODE_LINES_CAP + 1}"]


def where_is_rows() -> list[tuple[str, str]]:
    """(what, where) cells of each row of docs/design.md's "Where is" table."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("### Where is", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    return [tuple(line.split("|")[1:3]) for line in ("|" + section).splitlines()[2:]]


def where_is_table() -> list[tuple[str, list[str]]]:
    """(what, [files]) of each row of the "Where is" table."""
    return [(what.strip(), re.findall(r"`([\w/]+\.py)`", where)) for what, where in where_is_rows()]


def names_of_the_where_is_table() -> list[tuple[str, str]]:
    """(file, name) for each name the table gives in backticks after a file, e.g.
    `wim/scoring.py` (`cosines`, `similarities`)."""
    found = []
    for _, where in where_is_rows():
        path = None
        for token in re.findall(r"`([^`]+)`", where):
            if token.endswith(".py"):
                path = token
            elif path and token.isidentifier():
                found.append((path, token))
    return found


def import_distances(graph: dict[str, set[str]], start: str) -> dict[str, int]:
    """Fewest imports from `start` to each module it reaches (breadth first)."""
    distance, frontier = {start: 0}, [start]
    while frontier:
        nxt = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target not in distance:
                    distance[target] = distance[module] + 1
                    nxt.append(target)
        frontier = nxt
    return distance


def test_every_file_of_the_where_is_table_exists_within_three_imports_of_the_entry_point():
    rows = where_is_table()
    assert len(rows) >= 15 and all(files for _, files in rows), rows
    assert {"wim judge", "the pair rule", "the TRL configuration", "the judge",
            "zeta mixing"} <= {what.strip("`") for what, _ in rows}
    graph = import_graph()  # the pipeline imports each stage's module by its name in the table
    graph["wim.stages"] |= {stage.module for stage in STAGES}
    distance = import_distances(graph, "wim.cli")
    far = [f"{what}: {f} ({distance.get(module_name(Path(f)), 'unreachable')})"
           for what, files in rows for f in files
           if not (ROOT / f).is_file() or distance.get(module_name(Path(f)), 99) > 3]
    assert far == []


def test_every_name_in_the_where_is_table_is_defined_in_its_file():
    names = names_of_the_where_is_table()
    assert ("wim/scoring.py", "cosines") in names and ("wim/judges.py", "BackendJudge") in names
    missing = []
    for path, name in names:
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in tree.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Name)}
        if name not in defined:
            missing.append(f"{path}: {name}")
    assert missing == []


def test_the_distance_scan_counts_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": set(), "e": {"a"}}
    assert import_distances(graph, "a") == {"a": 0, "b": 1, "c": 2, "d": 3}
