"""Batch-file judging (`judge.batch: true`, `wim judge DIR --batch-results OUT...`): an external
http judge's requests written as OpenAI Batch JSONL and their answers taken back through the
live judge's own code (docs/design.md, "Judging", "Batch files").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_gen.stages import Shard, budget_stats, token_stats
from wim.backends.http_client import Failure
from wim.config import Config, ConfigError
from wim.errors import StageIncomplete, WimError
from wim.parsing import parse_judgement
from wim.records import write_records_atomic
from wim.rundir import RunDir

# OpenAI's Batch API limits per input file.
MAX_LINES = 50_000
MAX_BYTES = 200 * 10**6


class BatchWritten(StageIncomplete):
    """The requests are written; the judgements come from `--batch-results` (exit 3)."""

    def __init__(self, lines: int, files: list[Path], run: RunDir) -> None:
        super().__init__("judge", lines, {"judge/batch_requests": lines})
        self.files = files
        names = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        self.args = (
            f"wrote {lines} judge request(s) for the Batch API to {names}. Run each file (e.g. "
            "`vllm run_batch -i FILE -o OUT --model MODEL`, or upload it to OpenAI's Batch "
            f"API), then take the answers in with `wim judge {run.path} --batch-results OUT...`; "
            f"or `wim judge {run.path} --batch-submit` sends them to the Batch API at judge.http.",)


def custom_id(key: tuple[str, int], attempt: int) -> str:
    return f"{key[0]}#{key[1]}" + (f"@{attempt}" if attempt else "")


def check_batch_judge(cfg: Config) -> None:
    j = cfg.judge
    if not (j.role == "external" and j.backend == "http"):
        raise ConfigError("judge.batch works with an external http judge only (judge.role: "
                          f"external, judge.backend: http); this run has role {j.role}, backend "
                          f"{j.backend}. Set judge.batch: false to judge live.")


class BatchClient:
    """Stands in for the backend's HTTPClient. `answers`: custom_id -> result line; None while
    writing. Per judge call, `begin` gives the record keys and those judged already; a request
    is known by its seed (`_which`); `retried(text)`: whether the judge asks again."""

    def __init__(self, live, answers: dict[str, dict] | None, retry: str, attempts: int,
                 retried) -> None:
        self.live, self.answers, self.retry = live, answers, retry
        self.attempts, self.retried = attempts, retried
        self.written: list[dict] = []  # request lines to write
        self.missing = self.failed = 0
        # The rest of what HTTPBackend uses of its client: the live one's.
        self.run, self.gather, self.scrub = live.run, live.gather, live.scrub
        self._secret = live._secret  # (its repr)

    def begin(self, keys: list[tuple[str, int]], done, seed: int) -> None:
        self._order = [list(keys)]  # per attempt, the keys asked, in the backend's order
        self._answers: dict[tuple[str, int], str | None] = {}
        self._done, self._seed = done, seed

    def _which(self, seed: int) -> tuple[int, tuple[str, int]]:
        """(attempt, key) of a request, from its seed: the judge's attempt a asks with seed
        `seed + 7919 a` the conversations it retries, the j-th with `+ 1000 j` (sample_seed)."""
        for attempt in range(self.attempts):
            while len(self._order) <= attempt:  # the keys the judge asks again, in order
                self._order.append([k for k in self._order[-1]
                                    if self.retried(self._answers.get(k))])
            j, rest = divmod((seed - self._seed - 7919 * attempt) % 2**31, 1000)
            if not rest and j < len(self._order[attempt]):
                return attempt, self._order[attempt][j]
        raise RuntimeError(f"a judge request with seed {seed} not from this batch")

    async def request(self, path: str, payload, parse):
        body = payload()  # HTTPBackend's `prepare`
        if body is None:
            return None
        attempt, key = self._which(body["seed"])
        outcome = await self._answer(path, payload, body, parse, attempt, key)
        self._answers[key] = (outcome[0].text if isinstance(outcome, list) and outcome
                              and outcome[0].ok else None)
        return outcome

    async def _answer(self, path: str, payload, body: dict, parse, attempt: int, key):
        if key in self._done:
            return Failure("judged already")
        cid = custom_id(key, attempt)
        if self.answers is None or (attempt and cid not in self.answers
                                    and self.retry == "batch"):
            self.written.append({"custom_id": cid, "method": "POST",
                                 "url": "/v1" + path, "body": json.loads(json.dumps(body))})
            return Failure("asked in a batch file")
        line = self.answers.get(cid)
        if line is None and attempt:  # a parse retry, asked live
            return await self.live.request(path, payload, parse)
        if line is None:
            self.missing += 1
            return Failure(f"no batch result for {cid}")
        response = line.get("response") or {}
        if line.get("error") or response.get("status_code") != 200:
            self.failed += 1
            what = line.get("error") or response.get("body")
            return Failure(f"batch line {cid} failed: {json.dumps(what)[:300]}")
        outcome = parse(200, json.dumps(response.get("body")).encode(), f"batch line {cid}")
        self.failed += isinstance(outcome, Failure)  # a body that is not a chat completion
        return outcome


def read_results(paths: list[str]) -> dict[str, dict]:
    """custom_id -> result line of the given output files (a later line wins, so a file run
    again replaces the earlier answer)."""
    answers: dict[str, dict] = {}
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise WimError(f"batch results file {path!r} could not be read ({err}).") from None
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                answers[str(line["custom_id"])] = line
            except (ValueError, KeyError, TypeError):
                raise WimError(f"batch results file {path!r}, line {number}: not a Batch API "
                               "output line ({\"custom_id\", \"response\", \"error\"}).") from None
    return answers


def write_request_files(folder: Path, lines: list[dict], prefix: str = "requests",
                        max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> list[Path]:
    """Write `lines` as `<prefix>-00000.jsonl`, ... under the Batch API's per-file limits, each
    file atomically; older files of the prefix are removed."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{prefix}-*.jsonl"):
        old.unlink()
    shards: list[list[dict]] = []
    used = 0
    for line in lines:  # the bytes write_records_atomic writes
        size = len((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
        if not shards or len(shards[-1]) >= max_lines or used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(line)
        used += size
    files = [folder / f"{prefix}-{number:05d}.jsonl" for number in range(len(shards))]
    for path, shard in zip(files, shards, strict=True):
        write_records_atomic(path, shard)
    return files


def judge_in_batch(cfg: Config, run: RunDir, res, shard: Shard | None, results: list[str] | None,
                   judge_batches) -> dict[str, Any]:
    """Write the request files (no `results`), or ingest `results`, through the live judge
    stage's loop (`judge_batches`) one batch at a time (requests are known by batch seed)."""
    prompts, judge = res.batch_prompts(), res.judge()
    backend = judge.backend
    live = backend._client

    def retried(text: str | None) -> bool:  # as BackendJudge.judge decides a retry
        parsed = None if text is None else parse_judgement(text, judge.mode, judge.instructions)
        return parsed is not None and not parsed.ok

    client = BatchClient(live, read_results(results) if results else None,
                         cfg.judge.batch_retry, judge.max_retries + 1, retried)
    backend._client = client
    try:
        lost, counts = judge_batches(cfg, run, prompts, judge, shard, False, 1, client.begin)
    finally:
        backend._client = live
    folder = run.path / "batch"
    if client.answers is None and client.written:
        files = write_request_files(folder, client.written)
        raise BatchWritten(len(client.written), files, run)
    retry_files = write_request_files(folder, client.written, prefix="retry-requests")
    stats = token_stats(run.judgements, "judge", "judge")
    stats.update({"judge/backend_failed": lost, "judge/batch_missing": client.missing,
                  "judge/batch_failed": client.failed,
                  "judge/batch_retry_requests": len(client.written)})
    stats.update(budget_stats(counts))  # answers cut by the budget (data_gen/pipeline.py stops)
    run.write_stats("judge", stats)
    if lost:
        retries = (f"; {len(client.written)} parse retries are in "
                   f"{', '.join(map(str, retry_files))}: run them and pass their outputs too"
                   if retry_files else "")
        incomplete = StageIncomplete("judge", lost, stats)
        incomplete.args = (
            f"{lost} judgements have no verdict yet ({client.missing} without a result line, "
            f"{client.failed} whose line failed{retries}); they were not recorded (see "
            "stats/judge.json). Pass result files that hold them to `wim judge "
            f"{run.path} --batch-results ...` (lines already taken in are skipped).",)
        raise incomplete
    return stats


def judge_by_batch(cfg: Config, run: RunDir, res, shard: Shard | None, results: list[str] | None,
                   submit: bool, judge_batches) -> dict[str, Any]:
    """The judge stage with judge.batch: write the request files; or submit them (once); or
    take in the answers, given (`results`) or of the submitted batches (batch_submit.py)."""
    from data_gen import batch_submit

    check_batch_judge(cfg)  # before a judge is made for another kind of judge
    if submit:
        files = sorted((run.path / "batch").glob("requests-*.jsonl"))
        if not files:
            try:
                return judge_in_batch(cfg, run, res, shard, None, judge_batches)  # judged already
            except BatchWritten as written:
                files = written.files
        batch_submit.submit(cfg, run, files)
    elif results is None and not batch_submit.submitted_path(run).exists():
        return judge_in_batch(cfg, run, res, shard, None, judge_batches)
    answers = results if results is not None else batch_submit.collect(cfg, run)
    return judge_in_batch(cfg, run, res, shard, answers, judge_batches)
