"""The run directory: its layout (each file named here once), the run's identity and its lock.

docs/design.md, "The run directory", is the contract between stages that this module keeps:
the layout, what the run's identity holds (a second run with another identity is refused
before anything is written), and one writer at a time (`RunDir.lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from wim.config import Config, apply_overrides, config_from_dict, judge_http
from wim.errors import WimError
from wim.precision import machine, pin_dtypes, resolve_dtype, uses_auto
from wim.records import read_keyed, storage_error, write_atomic
from wim.sources import source_sha256

DATA_SECTIONS = ("seed", "prompts", "policy", "generation", "judge")
# Judge keys outside the run identity: on_parse_failure (`wim score` may switch it; the score
# stage's fingerprint holds it), how the requests are sent (live or in batch files) and
# whether a reasoning judge's thinking is kept beside its verdict.
JUDGE_NOT_IDENTITY = ("on_parse_failure", "http", "batch", "batch_retry", "batch_resubmits",
                      "keep_reasoning")
# The http keys that change which model writes a record (or what it refuses as too long); the
# others (concurrency, timeout_s, ...) change only how requests are sent, so may differ per run.
HTTP_IDENTITY_KEYS = ("model", "base_urls", "context_tokens", "adapter_serving")
# The run directory's files, relative to it; named nowhere else (tests/test_run_files.py).
CONFIG_FILE = "resolved_config.yaml"
SAMPLES, JUDGEMENTS, SCORES, PAIRS = ("samples.jsonl", "judgements.jsonl", "scores.jsonl",
                                      "pairs.jsonl")
PAIRS_FOLDER, PAIRS_CARD = "pairs", "pairs.README.md"  # a `datasets` folder; a card of pairs.jsonl
DATASET_FOLDER = "dataset"  # the Hub-ready dataset (data_gen/completions)
SPLIT = "split.json"  # which prompts are held out of training (wim/holdout)
AGREEMENT, SIMILARITIES = "agreement.json", "similarities.sqlite"  # labels vs WIM; score cache
SCORE_PROGRESS = "stats/score_progress.json"  # the settings of a score pass under way
STATS_FOLDER, TRAIN_FOLDER, PLOTS_FOLDER = "stats", "train", "plots"
# In train/: TRL's log history, the training's metrics, online DPO's verdicts and steps.
LOG_HISTORY, TRAIN_METRICS = "log_history.json", "metrics.json"
ONLINE_JUDGEMENTS, ONLINE_STEPS = "online_judgements.jsonl", "online_steps.jsonl"
ADAPTER_NAME = "adapter"  # the adapter's folder in train/
ADAPTER = f"{TRAIN_FOLDER}/{ADAPTER_NAME}"
ADAPTER_CONFIG = "adapter_config.json"  # in the adapter's folder: it is a trained adapter
ADAPTER_WEIGHTS = f"{ADAPTER}/adapter_model.safetensors"
EVAL, EVAL_MD, EVAL_AUDIT_FOLDER = "eval.json", "eval.md", "eval"  # eval/: answers, verdicts
REPORT, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
ROUNDS_FOLDER = "rounds"  # rounds/<r>/: one run directory per round of a multi-round run
ROUND_MARKER = "round.json"  # in rounds/<r>/: the adapter the round started from
BATCH_FOLDER = "batch"  # provider batch files (data_gen/batch_submit)
REFINE_FOLDER = "refine"  # `wim refine`'s outputs

_PACKAGES = ("wim", "torch", "transformers", "trl", "peft", "datasets", "sentence-transformers",
             "accelerate")


def stats_name(stage: str) -> str:  # relative to the run directory
    return f"{STATS_FOLDER}/{stage}.json"


class RunDirError(WimError):
    pass


class RunDirBusyError(RunDirError):
    """Another process holds the run directory's lock."""


def _http_identity(section) -> dict:
    http = {k: getattr(section, k) for k in HTTP_IDENTITY_KEYS}
    http["base_urls"] = sorted(http["base_urls"])
    if section.params:  # extra request fields change what the model writes (thinking on/off);
        http["params"] = section.params  # only when set, so older run directories still match
    return http


def identity(cfg: Config) -> dict:
    """What must not change within one run directory: the data sections, and the identifying
    http keys of the policy's server and an external judge's (base URLs as a set: their order
    is only the round-robin order). `auto` dtypes are resolved on this machine (imports torch)."""
    data = pin_dtypes(cfg).to_dict()
    ident = {k: data[k] for k in DATA_SECTIONS}
    ident["judge"] = {k: v for k, v in ident["judge"].items() if k not in JUDGE_NOT_IDENTITY}
    if cfg.policy.backend == "http":
        ident["http"] = _http_identity(cfg.http)
    if cfg.judge.role == "external" and cfg.judge.backend == "http":
        ident["judge_http"] = _http_identity(judge_http(cfg))
    return ident


def identity_sha256(cfg: Config, source_sha: str | None = None) -> str:
    """sha256 of the identity, and of the content of `generation.source` when given."""
    ident = identity(cfg)
    if source_sha is not None:
        ident["generation_source_sha256"] = source_sha
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _readable_source_sha256(cfg: Config) -> str | None:
    """sha256 of `generation.source`'s content (None: the policy samples, or it is unreadable)."""
    if cfg.generation.source is None:
        return None
    try:
        return source_sha256(cfg.generation.source, cfg.generation.source_split)
    except WimError:
        return None


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def samples(self) -> Path:
        return self.path / SAMPLES

    @property
    def judgements(self) -> Path:
        return self.path / JUDGEMENTS

    @property
    def scores(self) -> Path:
        return self.path / SCORES

    @property
    def pairs(self) -> Path:
        return self.path / PAIRS

    @property
    def train_folder(self) -> Path:
        return self.path / TRAIN_FOLDER

    @property
    def adapter(self) -> Path:
        """Where this run directory's training writes its adapter (see final_adapter)."""
        return self.path / ADAPTER

    @property
    def batch_folder(self) -> Path:
        return self.path / BATCH_FOLDER

    @property
    def rounds_folder(self) -> Path:
        return self.path / ROUNDS_FOLDER

    def round(self, r: int) -> RunDir:
        """Round r's run directory, rounds/<r>/ (absolute, so adapters named from it are)."""
        return RunDir(self.path.resolve() / ROUNDS_FOLDER / str(r))

    def round_runs(self) -> list[RunDir]:
        """Its rounds in order (rounds/<r>/, a multi-round run), else itself: the last trained."""
        folder = self.rounds_folder
        rounds = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()),
                        key=lambda p: int(p.name)) if folder.is_dir() else []
        return [RunDir(p) for p in rounds] or [self]

    def final_adapter(self) -> Path:
        """The run's trained adapter: its last round's (a multi-round run), else train/adapter.
        None trained yet is an error naming the command that trains it."""
        last = self.round_runs()[-1]
        if not (last.adapter / ADAPTER_CONFIG).is_file():
            train = (f"`wim train {self.path}` or " if last is self else "") + (
                f"`wim run CONFIG --out {self.path}`")
            raise RunDirError(f"{self.path} holds no trained adapter ("
                              f"{last.adapter / ADAPTER_CONFIG} is missing). Train first: {train}.")
        return last.adapter

    def stats_file(self, stage: str) -> Path:
        """stats/<stage>.json: a stage's counts, timings, fingerprint (data_gen/fingerprints)."""
        return self.path / stats_name(stage)

    def write_stats(self, stage: str, stats: dict) -> None:
        path = self.stats_file(stage)
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(stats, indent=2))

    def require(self, name: str, command: str) -> list[dict]:
        """A stage's input records; none is an error naming the command that makes them."""
        records = read_keyed(self.file(name))
        if not records:
            state = "is empty" if self.file(name).exists() else "does not exist"
            raise RunDirError(
                f"{self.file(name)} {state}, so there is nothing to work on. Run `{command} "
                f"{self.path}` first (or `wim run CONFIG --out {self.path}` for every stage)."
            )
        return records

    def read_meta(self) -> dict | None:
        if not self.config_file.exists():
            return None
        return yaml.safe_load(self.config_file.read_text())

    def training_dtype(self, cfg: Config) -> str:
        """The policy's dtype as the run asked for it, `auto` resolved where training runs: a
        run begun on a CPU without native bfloat16 trains in bfloat16 on a GPU that has it.
        (Sampling and judging keep the run's pinned dtype.)"""
        requested = cfg.policy.dtype
        if requested != "auto":
            requested = ((self.read_meta() or {}).get("dtype_requested") or {}).get(
                "policy", requested)
        return resolve_dtype(requested)

    def load_config(self, overrides: Sequence[str] = ()) -> Config:
        """The run's saved config with `--set KEY=VALUE` overrides (for every command)."""
        if (meta := self.read_meta()) is None:
            raise RunDirError(
                f"{self.path} holds no run (no resolved_config.yaml). Start one with "
                f"`wim run CONFIG --out {self.path}`."
            )
        return config_from_dict(apply_overrides(meta["config"], list(overrides)),
                                source=str(self.config_file))

    def shard(self) -> str | None:
        return (self.read_meta() or {}).get("shard")

    def claim(self, cfg: Config, shard: str | None = None) -> None:
        """Create the folder or check that it holds a run of the same data config."""
        meta = self.read_meta()
        if meta is not None:
            old = config_from_dict(meta["config"], source=str(self.config_file))
            was, now = identity(old), identity(cfg)
            if was != now or meta.get("shard") != shard:
                changed = _changed_keys(was, now)
                if meta.get("shard") != shard:
                    changed.append(f"shard ({meta.get('shard')} -> {shard})")
                raise RunDirError(
                    f"{self.path} already holds a run with a different config "
                    f"(changed: {', '.join(changed)}). Nothing was written. Use another --out "
                    "folder, or re-run with the config saved in "
                    f"{self.config_file}." + _dtype_advice(changed, was, now, meta)
                )
            self._check_source(cfg, meta)
        self.ensure_folder()
        if meta is None:
            self.save_config(cfg, shard)
        # An existing run keeps its saved config until the new stages succeed (the caller then
        # saves it), so a failed re-score never leaves a config that does not match the files.

    def _check_source(self, cfg: Config, meta: dict) -> None:
        """The same `generation.source` name with other content in it is another run."""
        saved = meta.get("source_sha256")
        now = None if saved is None else _readable_source_sha256(cfg)
        # Unreadable now (moved, offline): stages that read it fail with the loader's message.
        if now is not None and now != saved:
            raise RunDirError(
                f"{self.path} already holds a run of generation.source {cfg.generation.source!r}"
                f", but its content has changed since (sha256 {saved[:12]}... -> {now[:12]}...)."
                " Nothing was written. Use another --out folder, or restore the source file."
            )

    def save_config(self, cfg: Config, shard: str | None = None) -> None:
        source_sha = _readable_source_sha256(cfg)
        old = self.read_meta() or {}
        if source_sha is None and old.get("config", {}).get("generation", {}).get(
                "source") == cfg.generation.source:
            source_sha = old.get("source_sha256")  # checked when the source was last read
        pinned = pin_dtypes(cfg)
        meta = {
            "config": pinned.to_dict(),  # `auto` dtypes as resolved here
            "sha256": pinned.sha256(),
            "data_sha256": identity_sha256(cfg, source_sha),
            "source_sha256": source_sha,
            "shard": shard,
            # Where `auto` was resolved (the run's start, kept when resumed with dtypes pinned).
            "dtype_picked_for": (machine().describe() if uses_auto(cfg)
                                 else old.get("dtype_picked_for")),
            # As the run asked, for training_dtype; a pinned config read back keeps the old one.
            "dtype_requested": ({"policy": cfg.policy.dtype} if cfg.policy.dtype == "auto"
                                else old.get("dtype_requested", {"policy": cfg.policy.dtype})),
            "versions": package_versions(),
            "git_sha": git_sha(),
        }
        write_atomic(self.config_file, [yaml.safe_dump(meta, sort_keys=False)])

    def ensure_folder(self) -> None:
        """Create the folder, or say clearly why it cannot be (a file, no permission, ...)."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(
                f"{self.path} is a file, not a folder. Give --out a folder path (it is created "
                "when missing), or move the file away."
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise storage_error(err, self.path) from None

    @contextlib.contextmanager
    def lock(self, command: str = "") -> Iterator[None]:
        """Hold an exclusive lock on the run directory, or fail at once naming the holder
        (`command`, by default this process's `wim ...` command line). The kernel drops a
        `flock` when its process dies, so a killed run leaves no stale lock; the file stays
        (deleting it would let two processes lock two files)."""
        self.ensure_folder()
        path = self.path / ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise storage_error(err, path) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirBusyError(_busy_message(self.path, path)) from None
            holder = {"pid": os.getpid(), "host": socket.gethostname(),
                      "command": command or "wim " + " ".join(sys.argv[1:]),
                      "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            with contextlib.suppress(OSError):  # who holds it is for messages only
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
            yield
        finally:
            os.close(fd)  # also releases the lock


def _busy_message(folder: Path, lock_file: Path) -> str:
    holder: dict = {}
    for _ in range(20):  # the holder writes who it is right after taking the lock
        try:
            holder = json.loads(lock_file.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if holder:
            break
        time.sleep(0.05)
    who = (f"process {holder.get('pid', '?')} on {holder.get('host', '?')} "
           f"(`{holder.get('command', '?')}`, started {holder.get('started', '?')})"
           if holder else "another process (it is just starting)")
    return (
        f"{folder} is in use by {who}. Only one wim command may write a run directory at a "
        "time. Wait for it to finish (or stop it), then run this command again; nothing was "
        "written by this one."
    )


def _dtype_advice(changed: list[str], was: dict, now: dict, meta: dict) -> str:
    """Advice when the machine's choice of dtype differs between identities was, now."""
    keys = [k for k in changed if k.endswith(".dtype")]
    if not keys:
        return ""
    parts = [f"{k} {was[k.split('.')[0]]['dtype']} -> {now[k.split('.')[0]]['dtype']}"
             for k in keys]
    here = machine().describe()
    then = meta.get("dtype_picked_for") or {}
    return (f" The dtype changed ({'; '.join(parts)}): this run began on a CPU with "
            f"{then.get('cpu_capability', '?')} (native bfloat16: "
            f"{then.get('native_bf16', '?')}); `auto` here (CPU {here['cpu_capability']}, "
            f"native bfloat16: {here['native_bf16']}, CUDA: {here['cuda']}) picks another. "
            "One run never mixes dtypes: set the run's dtype explicitly to continue it (e.g. "
            f"--set {keys[0]}={was[keys[0].split('.')[0]]['dtype']}; slow where bfloat16 is "
            "emulated), or start a new run in another --out folder.")


def _changed_keys(old: dict, new: dict) -> list[str]:
    changed = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            changed.append(section)
    return changed


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None

