"""Experiment configs (wim/config/): loading, overrides, validation, hashing, and the CLI."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from wim.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
    read_yaml,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def _with(overrides: list[str]) -> Config:
    return config_from_dict(apply_overrides(read_yaml(QUICKSTART), overrides), source="q.yaml")


def _run_wim(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WIM_CACHE": os.environ.get("WIM_CACHE", "/tmp/wimcache")}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


# --- loading ---------------------------------------------------------------------------------


def test_quickstart_loads_with_its_values():
    cfg = load_config(QUICKSTART)
    assert cfg.seed == 0
    assert cfg.generation.k == 2
    assert cfg.generation.batch_size == 16
    assert cfg.judge.max_new_tokens == 32
    assert cfg.scoring.zeta == 0.4
    assert cfg.scoring.report_zetas == [0.0, 0.4, 1.0]
    assert cfg.dpo.learning_rate == 2.0e-3
    assert isinstance(cfg.dpo.learning_rate, float)
    assert cfg.dpo.max_steps == 30
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.prompts.limit is None
    # Fields not in the YAML keep their defaults.
    assert cfg.pairs.tie_tolerance == 1e-6
    assert cfg.dpo.extra == {}


def test_missing_config_file_is_a_config_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_invalid_yaml_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scoring: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_top_level_list_is_a_config_error(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


# --- unknown keys ----------------------------------------------------------------------------


def test_unknown_top_level_key_names_key_and_file(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(QUICKSTART.read_text() + "\nscorin:\n  zeta: 0.5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "unknown key 'scorin'" in message
    assert str(path) in message


def test_unknown_nested_key_names_dotted_key_and_file(tmp_path):
    data = read_yaml(QUICKSTART)
    data["scoring"]["zetta"] = 0.5
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "'scoring.zetta'" in message
    assert str(path) in message
    # It lists what is known in that section, so the typo is easy to fix.
    assert "zeta" in message.split("Known keys here:")[1]


def test_unknown_key_via_override():
    with pytest.raises(ConfigError, match=r"unknown key 'scoring\.zetta'"):
        load_config(QUICKSTART, ["scoring.zetta=1"])


def test_override_through_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="does not name a config field"):
        apply_overrides(read_yaml(QUICKSTART), ["scoring.zeta.x=1"])


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["scoring.zeta"])


# --- overrides -------------------------------------------------------------------------------


def test_overrides_change_fields():
    cfg = _with([
        "scoring.zeta=1",
        "generation.k=4",
        "scoring.report_zetas=[0.0, 0.25, 1.0]",
        "lora.target_modules=[q_proj, k_proj, v_proj]",
        "dpo.extra={warmup_ratio: 0.1}",
        "judge.model=my-judge",
        "seed=7",
        "prompts.limit=null",
    ])
    assert cfg.scoring.zeta == 1.0 and isinstance(cfg.scoring.zeta, float)
    assert cfg.generation.k == 4
    assert cfg.scoring.report_zetas == [0.0, 0.25, 1.0]
    assert cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj"]
    assert cfg.dpo.extra == {"warmup_ratio": 0.1}
    assert cfg.judge.model == "my-judge"
    assert cfg.seed == 7
    assert cfg.prompts.limit is None
    # Untouched fields keep their YAML values.
    assert cfg.generation.batch_size == 16


def test_overrides_do_not_mutate_the_input():
    data = read_yaml(QUICKSTART)
    apply_overrides(data, ["scoring.zeta=1", "generation.k=5"])
    assert data["scoring"]["zeta"] == 0.4
    assert data["generation"]["k"] == 2


def test_override_creates_missing_section():
    cfg = config_from_dict(apply_overrides({}, ["wandb.project=abc", "http.timeout_s=5"]))
    assert cfg.wandb.project == "abc"
    assert cfg.http.timeout_s == 5.0


def test_later_override_wins():
    assert _with(["scoring.zeta=0.1", "scoring.zeta=0.9"]).scoring.zeta == 0.9


def test_value_with_equals_sign_keeps_the_rest():
    assert _with(["judge.criteria=a=b"]).judge.criteria == "a=b"


def test_scientific_notation_without_dot_is_a_float():
    assert _with(["dpo.learning_rate=1e-5"]).dpo.learning_rate == 1e-5


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("zeta", [2, -0.1, 1.0000001])
def test_zeta_out_of_range(zeta):
    with pytest.raises(ConfigError) as info:
        _with([f"scoring.zeta={zeta}"])
    message = str(info.value)
    assert "'scoring.zeta'" in message
    assert "must lie in [0, 1]" in message
    assert "q.yaml" in message


@pytest.mark.parametrize("zeta", [0, 1, 0.0, 1.0])
def test_zeta_bounds_are_allowed(zeta):
    assert _with([f"scoring.zeta={zeta}"]).scoring.zeta == float(zeta)


def test_report_zetas_out_of_range():
    with pytest.raises(ConfigError, match=r"'scoring\.report_zetas' must hold values in \[0, 1\]"):
        _with(["scoring.report_zetas=[0.0, 1.5]"])


def test_report_zetas_with_strings_is_a_config_error():
    with pytest.raises(ConfigError, match="report_zetas"):
        _with(["scoring.report_zetas=[a]"])


def test_k_below_two():
    with pytest.raises(ConfigError, match=r"'generation\.k' must be at least 2"):
        _with(["generation.k=1"])


def test_negative_learning_rate():
    data = read_yaml(QUICKSTART)
    data["dpo"]["learning_rate"] = -1e-5
    with pytest.raises(ConfigError, match=r"'dpo\.learning_rate' must be positive, got -1e-05"):
        config_from_dict(data)


def test_negative_learning_rate_via_override_is_rejected():
    # Whatever the parse of '-1e-5', the override must not pass validation.
    with pytest.raises(ConfigError, match=r"'dpo\.learning_rate'"):
        _with(["dpo.learning_rate=-1e-5"])
    with pytest.raises(ConfigError, match=r"'dpo\.learning_rate' must be positive"):
        _with(["dpo.learning_rate=-0.00001"])


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("pairs.strategy", "best_vs_worst, best_vs_random, all"),
        ("pairs.tie_policy", "drop, first, random"),
        ("judge.role", "fixed, changing, external"),
        ("judge.mode", "wim, numeric"),
        ("policy.backend", "transformers, llama_cpp, http"),
    ],
)
def test_bad_choice_names_the_allowed_ones(key, allowed):
    with pytest.raises(ConfigError) as info:
        _with([f"{key}=foo"])
    message = str(info.value)
    assert f"'{key}' must be one of {allowed}, got 'foo'" in message


def _literal_fields() -> dict[str, tuple]:
    """Dotted key -> allowed values, for every `Literal`-typed field of every section."""
    fields = {}

    def walk(cls: type, prefix: str) -> None:
        for name, hint in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{name}.")
                continue
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            literal = hint if typing.get_origin(hint) is typing.Literal else (
                args[0] if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal
                else None)
            if literal is not None:
                fields[f"{prefix}{name}"] = typing.get_args(literal)

    walk(Config, "")
    return fields


def test_the_choices_are_literal_types_beside_their_fields():
    """The string fields with a fixed set of values (once a table in checks.py) are Literals."""
    assert set(_literal_fields()) >= {
        "policy.backend", "policy.dtype", "generation.overlong", "generation.source_shape",
        "judge.role", "judge.backend", "judge.dtype", "judge.mode", "judge.prompt",
        "judge.on_parse_failure", "judge.instructions_in", "judge.overlong", "http.adapter_serving",
        "scoring.dtype", "scoring.backend", "pairs.strategy", "pairs.tie_policy",
        "dpo.reference_pass", "blind.backend", "blind.dtype", "blind.mode", "blind.verdict",
        "training.adapter", "training.mode", "training.online_tie_policy",
        "refine.evaluator_backend", "refine.baseline", "refine.test", "refine.pairs_rule",
        "refine.pairs_policy"}


@pytest.mark.parametrize(("key", "allowed"), sorted(_literal_fields().items()),
                         ids=sorted(_literal_fields()))
def test_a_literal_field_takes_only_its_values(key, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [f"{key}=bogus"])
    assert str(info.value) == (f"{QUICKSTART}: '{key}' must be one of {', '.join(allowed)}, "
                               "got 'bogus'.")

    def get(cfg: Config):
        return functools.reduce(getattr, key.split("."), cfg)

    default = get(Config())
    assert default in allowed
    assert get(load_config(QUICKSTART, [f"{key}={default}"])) == default
    for value in allowed:
        # Another check may refuse a value in the quickstart's company; never the choice check.
        try:
            cfg = load_config(QUICKSTART, [f"{key}={value}"])
        except ConfigError as err:
            assert f"'{key}' must be one of" not in str(err)
        else:
            assert get(cfg) == value


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"'generation\.k' must be of type int, got 'two'"):
        _with(["generation.k=two"])


def test_bool_is_not_an_int():
    with pytest.raises(ConfigError, match=r"'generation\.k' must be of type int, got True"):
        _with(["generation.k=true"])


def test_float_is_not_an_int():
    with pytest.raises(ConfigError, match=r"'generation\.k' must be of type int"):
        _with(["generation.k=2.5"])


def test_null_for_a_required_field():
    with pytest.raises(ConfigError, match=r"'scoring\.zeta' may not be null"):
        _with(["scoring.zeta=null"])


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"'scoring' must be a mapping"):
        _with(["scoring=3"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("generation.top_p=0", "generation.top_p"),
        ("generation.temperature=-1", "generation.temperature"),
        ("judge.max_retries=-1", "judge.max_retries"),
        ("prompts.limit=0", "prompts.limit"),
        ("lora.r=0", "lora.r"),
        ("dpo.max_steps=0", "dpo.max_steps"),
    ],
)
def test_other_ranges(override, key):
    with pytest.raises(ConfigError, match=f"'{key}' must"):
        _with([override])


def test_external_judge_needs_a_model():
    with pytest.raises(ConfigError, match=r"'judge\.model' must name a model"):
        _with(["judge.role=external"])
    assert _with(["judge.role=external", "judge.model=x"]).judge.model == "x"


def test_http_backend_needs_urls():
    with pytest.raises(ConfigError, match=r"'http\.base_urls' must list at least one URL"):
        _with(["policy.backend=http"])


# --- hashing and dumping ---------------------------------------------------------------------


def test_sha256_is_stable_for_equal_configs():
    a, b = load_config(QUICKSTART), load_config(QUICKSTART)
    assert a.sha256() == b.sha256()
    assert len(a.sha256()) == 64
    # An override that sets the same value gives the same hash; 1 and 1.0 coerce alike.
    assert _with(["scoring.zeta=0.4"]).sha256() == a.sha256()
    assert _with(["scoring.zeta=1"]).sha256() == _with(["scoring.zeta=1.0"]).sha256()


def test_sha256_equal_for_int_and_float_list_elements():
    a = _with(["scoring.report_zetas=[0, 0.4, 1]"])
    b = _with(["scoring.report_zetas=[0.0, 0.4, 1.0]"])
    assert a == b
    assert a.sha256() == b.sha256()


@pytest.mark.parametrize(
    "override", ["scoring.zeta=0.5", "generation.k=3", "seed=1", "dpo.extra={a: 1}"]
)
def test_sha256_changes_when_a_field_changes(override):
    assert _with([override]).sha256() != load_config(QUICKSTART).sha256()


def test_saved_config_round_trip(tmp_path):
    cfg = _with(["scoring.zeta=1", "dpo.extra={warmup_ratio: 0.1}", "prompts.limit=3"])
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)  # as RunDir.save_config writes it
    again = config_from_dict(yaml.safe_load(text))
    assert again == cfg
    assert again.sha256() == cfg.sha256()
    path = tmp_path / "dumped.yaml"
    path.write_text(text)
    assert load_config(path) == cfg
    # Sections come out in declaration order, not sorted.
    assert list(yaml.safe_load(text)) == list(Config().to_dict())


# --- the CLI ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("scoring.zeta=2", ["zeta", "[0, 1]"]),
        ("scoring.zetta=1", ["scoring.zetta", "unknown key"]),
    ],
)
def test_cli_bad_override_fails_cleanly(tmp_path, override, expected):
    out = tmp_path / "x"
    proc = _run_wim("-m", "wim", "run", "configs/quickstart.yaml", "--set", override,
                    "--out", str(out))
    assert proc.returncode != 0
    for text in expected:
        assert text in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Traceback" not in proc.stdout
    assert not out.exists()


def test_cli_help_does_not_import_torch():
    proc = _run_wim("-X", "importtime", "-m", "wim", "--help")
    assert proc.returncode == 0
    assert "usage: wim" in proc.stdout
    assert "run" in proc.stdout
    imports = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imports, "python -X importtime printed no import lines"
    names = [line.rsplit("|", 1)[-1].strip() for line in imports]
    assert "wim.cli" in names
    assert not [n for n in names if n == "torch" or n.startswith("torch.")]
    assert not [n for n in names if n.split(".")[0] in ("transformers", "trl")]


@pytest.mark.parametrize("overrides, key", [
    (["judge.prompt=authors", "judge.mode=numeric"], "judge.prompt"),
    (["judge.prompt=theirs"], "judge.prompt"),
    (["judge.on_parse_failure=zero"], "judge.on_parse_failure"),
    (["policy.adapter=/x", "policy.backend=llama_cpp"], "policy.adapter"),
    (["pairs.tie_tolerance=-0.5"], "pairs.tie_tolerance"),
])
def test_paper_setup_keys_are_checked(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _with(overrides)


def test_every_config_field_has_help_text() -> None:
    """Each dataclass field is followed by its attribute docstring (as TRL and open-instruct)."""
    import ast

    import wim.config

    files = [*Path(wim.config.__file__).parent.glob("*.py")]
    classes = [n for f in files for n in ast.parse(f.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name.endswith(("Config", "Section"))]
    # Every section of Config is among the classes scanned (none defined elsewhere).
    sections = {t.__name__ for t in typing.get_type_hints(wim.config.Config).values()
                if dataclasses.is_dataclass(t)}
    assert sections <= {c.name for c in classes}
    undocumented = []
    for cls in classes:
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                              and isinstance(nxt.value.value, str))
                if not documented:
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert not undocumented, undocumented


def test_numeric_baseline_differs_from_the_quickstart_only_in_scoring():
    """A run of each then compares scoring alone (not lr, beta, steps or the held-out prompts)."""
    from wim.config import load_config

    def flat(data: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in data.items():
            if isinstance(value, dict) and value:
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    wim = flat(load_config(QUICKSTART).to_dict())
    numeric = flat(load_config(ROOT / "configs" / "numeric_baseline.yaml").to_dict())
    differ = {k for k in wim.keys() | numeric.keys() if wim.get(k) != numeric.get(k)}
    assert differ == {"judge.mode", "scoring.zeta", "scoring.report_zetas"}
    assert (numeric["judge.mode"], numeric["scoring.zeta"]) == ("numeric", 0.0)
