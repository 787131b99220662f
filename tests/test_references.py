"""Every pointer in the prose leads somewhere: a `docs/x.md, "Section"` reference names a heading
of that file (or, after the first, a list item's opening words there), and a repository path
named in a docstring, a comment or a Markdown page exists (a glob such as `dtype_*.txt` matches
a file). Code is not scanned, only its docstrings and comments: a test may build paths that do
not exist.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("wim", "data_gen", "training", "tests", "docs")
# `docs/design.md, "Judging", "Batch files"`: a file, then one or more quoted names (a path
# outside the repository, such as /work/shared/DESIGN.md, is not checked).
SECTION_REF = re.compile(
    r'(?<![\w/.-])((?:docs/)?[\w-]+\.md),?\s+((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)')
REPO_PATH = re.compile(
    r"(?<![\w/.$<-])((?:wim|data_gen|training|tests|docs|configs)/[\w/.*-]*\w"
    r"\.(?:py|md|txt|yaml|yml|json|jsonl|js|css|toml|html))\b")


def prose_of_python(source: str) -> str:
    """The docstrings (any string standing alone as a statement) and comments of a module."""
    parts = [node.value.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str)]
    parts += [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return "\n".join(parts)


def prose_files() -> list[tuple[str, str]]:
    """(file, prose) of every scanned file; line breaks inside a reference are spaces."""
    paths = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".py", ".md") and p != Path(__file__).resolve()]
    paths.append(ROOT / "README.md")
    return [(str(p.relative_to(ROOT)),
             " ".join((prose_of_python(p.read_text()) if p.suffix == ".py"
                       else p.read_text()).split()))
            for p in paths]


def headings(markdown: str) -> list[str]:
    return [line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#")]


def dangling_section_refs(files: list[tuple[str, str]], root: Path = ROOT) -> list[str]:
    """References whose file is missing or whose section no heading begins with."""
    bad = []
    for name, text in files:
        for match in SECTION_REF.finditer(text):
            doc = match.group(1) if match.group(1).startswith("docs/") else f"docs/{match.group(1)}"
            if not (root / doc).is_file():
                bad.append(f"{name}: {doc} does not exist")
                continue
            markdown = (root / doc).read_text()
            heads = headings(markdown)
            for i, section in enumerate(re.findall(r'"([^"]+)"', match.group(2))):
                in_list = i > 0 and re.search(rf"^- {re.escape(section)}\b", markdown, re.M)
                if not in_list and not any(h.startswith(section) for h in heads):
                    bad.append(f'{name}: {doc}, "{section}" is no heading')
    return bad


def dangling_paths(files: list[tuple[str, str]], root: Path = ROOT) -> list[str]:
    """Repository paths that name nothing; a path said to be deleted is history, not a pointer."""
    bad = []
    for name, text in files:
        for match in REPO_PATH.finditer(text):
            path, after = match.group(1), text[match.end():match.end() + 12]
            if "deleted" not in after and not any(root.glob(path)):
                bad.append(f"{name}: {path}")
    return bad


def test_every_section_reference_names_a_heading():
    files = prose_files()
    assert sum(len(SECTION_REF.findall(text)) for _, text in files) > 30
    assert dangling_section_refs(files) == []


def test_every_repository_path_in_the_prose_exists():
    files = prose_files()
    assert sum(len(REPO_PATH.findall(text)) for _, text in files) > 100
    assert dangling_paths(files) == []


def test_the_scans_find_a_dangling_section_and_path(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Judging\n\n- Batch files: ...\n")
    source = ('"""See docs/design.md, "Judging", "Batch files"; docs/design.md, "Gone\n'
              'section"; docs/gone.md, "X"."""\n# see wim/gone.py and docs/design.md\n'
              'x = "wim/no.py"\n')
    (tmp_path / "m.py").write_text(source)
    files = [("m.py", " ".join(prose_of_python(source).split()))]
    assert dangling_section_refs(files, tmp_path) == [
        'm.py: docs/design.md, "Gone section" is no heading', "m.py: docs/gone.md does not exist"]
    assert dangling_paths(files, tmp_path) == ["m.py: docs/gone.md", "m.py: wim/gone.py"]
