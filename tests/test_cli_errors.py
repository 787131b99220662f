"""Bad input gets one clear paragraph, no traceback, and nothing already written is lost."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import QUICKSTART, run_wim

from wim.config import load_config
from wim.rundir import RunDir


def _fails(args: list[str]) -> str:
    proc = run_wim(args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "wim: error:" in proc.stderr
    return proc.stderr


def test_missing_prompts_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = _fails(["run", str(QUICKSTART), "--out", str(out),
                  "--set", f"prompts.source={tmp_path / 'nope.jsonl'}"])
    assert "nope.jsonl" in err
    assert not out.exists()


def test_empty_and_malformed_prompts_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = _fails(["generate", str(QUICKSTART), "--out", str(tmp_path / "a"),
                  "--set", f"prompts.source={empty}"])
    assert "empty.jsonl" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    err = _fails(["generate", str(QUICKSTART), "--out", str(tmp_path / "b"),
                  "--set", f"prompts.source={bad}"])
    assert "bad.jsonl" in err and "line 2" in err


def test_out_of_range_values() -> None:
    for override, words in [("scoring.zeta=2", "[0, 1]"), ("generation.k=1", "at least 2"),
                            ("dpo.learning_rate=-1e-5", "positive")]:
        err = _fails(["run", str(QUICKSTART), "--out", "/tmp/never-created", "--set", override])
        assert override.split("=")[0] in err and words in err
    assert not Path("/tmp/never-created").exists()


def test_existing_run_with_other_config_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    samples = out / "samples.jsonl"
    samples.write_text('{"prompt_id": "x", "sample_idx": 0}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    err = _fails(["run", str(QUICKSTART), "--out", str(out), "--set", "generation.k=3"])
    assert "generation.k" in err and "different config" in err
    # Only the lock file is new: the refusal happens while holding the folder's lock.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before


def test_stage_on_a_folder_without_a_run(tmp_path: Path) -> None:
    err = _fails(["score", str(tmp_path)])
    assert "no resolved_config.yaml" in err


def test_unknown_models_get_a_clear_error(tmp_path: Path) -> None:
    err = _fails(["generate", str(QUICKSTART), "--out", str(tmp_path / "a"),
                  "--set", f"policy.model={tmp_path / 'no-such-model'}",
                  "--set", "prompts.limit=2"])
    assert "could not load model" in err and "no-such-model" in err
    err = _fails(["run", str(QUICKSTART), "--out", str(tmp_path / "b"),
                  "--set", "policy.model=bundled:gpt-5"])
    assert "bundled:gpt-5" in err


def test_train_before_pairs_says_what_to_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    err = _fails(["train", str(out)])
    assert "pairs.jsonl" in err and "wim pairs" in err


def test_user_errors_share_one_base_class() -> None:
    from wim.config import ConfigError
    from wim.errors import InputError, WimError
    from wim.models import ModelNotFoundError
    from wim.prompts import PromptsError
    from wim.records import RecordsError
    from wim.rundir import RunDirError

    for cls in (ConfigError, RunDirError, PromptsError, RecordsError, ModelNotFoundError,
                InputError):
        assert issubclass(cls, WimError)
        # Not a ValueError: the CLI must not mistake a library's ValueError for one of these.
        assert not issubclass(cls, ValueError)


def test_bad_shard_is_a_user_error(tmp_path: Path) -> None:
    err = _fails(["generate", str(QUICKSTART), "--out", str(tmp_path / "a"), "--shard", "3/2"])
    assert "--shard" in err and "3/2" in err


def test_value_error_inside_trl_keeps_its_traceback(tmp_path: Path) -> None:
    """A ValueError raised by TRL (not by us) is not dressed up as a user error."""
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    row = {"prompt": [{"role": "user", "content": "q"}],
           "chosen": [{"role": "assistant", "content": "a"}],
           "rejected": [{"role": "assistant", "content": "b"}]}
    (out / "pairs.jsonl").write_text(json.dumps(row) + "\n")
    # trl.DPOConfig.__post_init__ raises ValueError: 2 loss weights for 1 loss type.
    proc = run_wim(["train", str(out), "--set", "dpo.extra={loss_weights: [1.0, 2.0]}"],
                   check=False)
    assert proc.returncode not in (0, 2)
    assert "Traceback" in proc.stderr and "ValueError" in proc.stderr
    assert "loss_weights" in proc.stderr and "wim: error:" not in proc.stderr
