"""The WIM arithmetic is written once: the cosine, the rating's normalisation, the zeta mix, the
1-10 scale and the tie and pair rule each live in one file (docs/design.md, "Where is").

The "Where is" tests check that the named files define the named functions; they would pass
beside a second copy of the cosine elsewhere. This scan looks for the arithmetic itself in the
code (strings, docstrings and comments stripped), and fails where it appears a second time.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wim", "data_gen", "training")

NAME = r"(?:\w+ \. )*\w*"  # a name or a dotted one, as tokens: `cfg . zeta`
# (what, the arithmetic as a regex over the space-joined tokens, the one file that may hold it)
FORMULAS = [
    ("the cosine of two embeddings", r"\bnp \. sum \( [^)]*\* [^)]*axis = (- )?1 \)",
     "wim/scoring.py"),
    ("a library's cosine", r"\b(cos_sim|pairwise_cos_sim|cosine_similarity)\b", None),
    ("the rating's normalisation (N - 5) / 5", r"- 5(\.0)? \) / 5\b", "wim/scoring.py"),
    ("the zeta mix", rf"\( 1(\.0)? - {NAME}zeta \) \*", "wim/scoring.py"),
    ("the 1-10 scale x * 5 + 5", r"\* 5(\.0)? \+ 5\b", "wim/scoring.py"),
    ("the tie test |gap| <= tolerance", r"\babs \( .{1,60}\) <= ", "wim/scoring.py"),
    ("the pair rule's best and worst by score",
     r"\b(max|min) \( [^()]+ , key = lambda \w+ : \w+ \[ \"score\" \] \)", "wim/pairs.py"),
]


def code_tokens(source: str) -> str:
    """The module's code as space-joined tokens, with comments and prose dropped: a string
    literal stays only when it is a short key such as "score" (no space, at most 20 characters),
    so docstrings and messages that state a formula in words are not code."""
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            if " " not in tok.string and len(tok.string) <= 20:
                kept.append(tok.string)
        elif tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT):
            kept.append(tok.string)
    return " ".join(kept)


def where_written(root: Path, pattern: str) -> dict[str, int]:
    """{file: number of matches} of `pattern` over the packages' code under `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if n := len(re.findall(pattern, code_tokens(path.read_text()))):
                found[path.relative_to(root).as_posix()] = n
    return found


@pytest.mark.parametrize(("what", "pattern", "home"), FORMULAS, ids=[f[0] for f in FORMULAS])
def test_each_formula_is_written_in_its_one_file(what: str, pattern: str, home: str | None):
    found = where_written(ROOT, pattern)
    if home is None:  # the library's cosine is not used: wim/scoring.py's `cosines` is
        assert found == {}, f"{what}: {found}"
    else:
        assert list(found) == [home], f"{what}: written in {found}, expected only in {home}"


def test_the_scan_finds_a_copied_formula_and_not_its_mention_in_text(tmp_path: Path):
    """A second copy in another module is found; the same arithmetic in a docstring, a string
    or a comment is not (wim/card.py states the formula in words, as it should)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "wim" / "scoring.py").write_text(
        "def mix(r, s, zeta):\n    return (1 - zeta) * r + zeta * s\n")
    (tmp_path / "training" / "reward.py").write_text(
        '"""score = (1 - zeta) * rating_norm + zeta * similarity"""\n'
        "# (1 - zeta) * r\n"
        "TEXT = f'{(1 - zeta)} * r'\n")
    zeta_mix = dict((f[0], f[1]) for f in FORMULAS)["the zeta mix"]
    assert where_written(tmp_path, zeta_mix) == {"wim/scoring.py": 1}
    (tmp_path / "training" / "reward.py").write_text(
        "def reward(r, s, cfg):\n    return (1.0 - cfg.zeta) * r + cfg.zeta * s\n")
    assert where_written(tmp_path, zeta_mix) == {"training/reward.py": 1, "wim/scoring.py": 1}
    cosine = dict((f[0], f[1]) for f in FORMULAS)["the cosine of two embeddings"]
    (tmp_path / "data_gen" / "score.py").write_text(
        "import numpy as np\nsim = np.sum(a * b, axis=-1)\n")
    assert where_written(tmp_path, cosine) == {"data_gen/score.py": 1}
