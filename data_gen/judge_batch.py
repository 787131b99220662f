"""Batch-file judging (`judge.batch: true`, `wim judge DIR --batch-results OUT...`): an external
http judge's requests written as OpenAI Batch JSONL and their answers taken back through the
live judge's own code (docs/design.md, "Judging", "Batch files"). With `--batch-submit`
(batch_submit.py) the answers of every round are taken in, and the requests still without one
are written as the next round (`next_round`): the same bodies, never one already answered.

While writing, the `BatchClient` answers every recorded request with a failure, so nothing is
recorded until the answers are ingested; custom_id being the record key makes ingestion
idempotent.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from data_gen import batch_submit
from data_gen.batch_submit import line_error, line_outcome, summarise
from data_gen.stages import Shard, budget_stats, token_stats
from wim.backends.http_client import Failure
from wim.config import Config, ConfigError
from wim.errors import StageIncomplete, WimError
from wim.parsing import parse_judgement
from wim.pricing import role_price
from wim.records import write_atomic, write_records_atomic
from wim.retry import attempt_seed
from wim.rundir import RunDir

logger = logging.getLogger(__name__)

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
        self.unanswered: list[tuple[dict, str]] = []  # (request line, why): worth sending again
        self.refused: list[dict] = []  # {"custom_id", "error"}: final failures
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
        `attempt_seed(seed, a)` (wim/retry.py) the conversations it retries, the j-th with
        `+ 1000 j` (sample_seed)."""
        for attempt in range(self.attempts):
            while len(self._order) <= attempt:  # the keys the judge asks again, in order
                self._order.append([k for k in self._order[-1]
                                    if self.retried(self._answers.get(k))])
            j, rest = divmod((seed - attempt_seed(self._seed, attempt)) % 2**31, 1000)
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
        def request() -> dict:  # the request line, a copy of the body as it is now
            return {"custom_id": cid, "method": "POST", "url": "/v1" + path,
                    "body": json.loads(json.dumps(body))}

        if self.answers is None or (attempt and cid not in self.answers
                                    and self.retry == "batch"):
            self.written.append(request())
            return Failure("asked in a batch file")
        line = self.answers.get(cid)
        if line is None and attempt:  # a parse retry, asked live
            return await self.live.request(path, payload, parse)
        if line is None:
            self.missing += 1
            self.unanswered.append((request(), "no result line"))
            return Failure(f"no batch result for {cid}")
        if line_outcome(line) != "answered":
            self.failed += 1
            why = line_error(line)
            if line_outcome(line) == "resend":
                self.unanswered.append((request(), why))
            else:
                self.refused.append({"custom_id": cid, "error": why})
            return Failure(f"batch line {cid} failed: {why}")
        outcome = parse(200, json.dumps(line["response"].get("body")).encode(),
                        f"batch line {cid}")
        if isinstance(outcome, Failure):  # answered (and billed), but not a chat completion
            self.failed += 1
            self.refused.append({"custom_id": cid, "error": outcome.reason[:300]})
        else:  # its tokens are billed with the batch discount
            outcome = [dataclasses.replace(c, batch=True) for c in outcome]
        return outcome


def read_results(paths: list[str]) -> dict[str, dict]:
    """custom_id -> result line of the given output files (a later line wins, so a file run
    again replaces the earlier answer, except that a failed line never replaces an answer)."""
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
                cid = str(line["custom_id"])
                if cid not in answers or line_outcome(answers[cid]) != "answered" or \
                        line_outcome(line) == "answered":  # a failure never hides an answer
                    answers[cid] = line
            except (ValueError, KeyError, TypeError, AttributeError):
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


class Resubmit(StageIncomplete):
    """The requests the batches left without an answer are written as the next round's request
    files, for `wim judge DIR --batch-submit` (exit 3)."""


class BatchFailures(WimError):
    """Requests that failed for good: refused by the API (a 4xx), or still without an answer
    after judge.batch_resubmits resends (exit 2: sending them again would not help)."""


def judge_in_batch(cfg: Config, run: RunDir, res, shard: Shard | None, results: list[str] | None,
                   judge_batches, rounds: bool = False) -> dict[str, Any]:
    """Write the request files (no `results`), or ingest `results`, through the live judge
    stage's loop (`judge_batches`) one batch at a time (requests are known by batch seed).
    `rounds`: the results are those of the submitted batches (batch_submit.py), and what is
    still unanswered goes to the next round's files (`next_round`)."""
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
    folder = run.batch_folder
    if client.answers is None and client.written:
        files = write_request_files(folder, client.written)
        raise BatchWritten(len(client.written), files, run)
    stats = token_stats(run.judgements, "judge", "judge", role_price(cfg, "judge"))
    stats.update({"judge/backend_failed": lost, "judge/batch_missing": client.missing,
                  "judge/batch_failed": client.failed,
                  "judge/batch_retry_requests": len(client.written)})
    stats.update(budget_stats(counts))  # answers cut by the budget (data_gen/pipeline.py stops)
    if rounds:
        return next_round(cfg, run, client, stats, lost)
    retry_files = write_request_files(folder, client.written, prefix="retry-requests")
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


def next_round(cfg: Config, run: RunDir, client: BatchClient, stats: dict, lost: int
               ) -> dict[str, Any]:
    """After the submitted batches' answers are in: the requests without one that were sent
    at most judge.batch_resubmits times, and the parse retries for a batch, become the next
    round's files (Resubmit); the rest are final failures, kept in DIR/batch/failed.jsonl
    (BatchFailures). Nothing answered is written again."""
    state = batch_submit.load_state(run)
    sent, cap = batch_submit.sends(run, state), cfg.judge.batch_resubmits
    again = [(line, why) for line, why in client.unanswered if sent[line["custom_id"]] <= cap]
    final = client.refused + [
        {"custom_id": line["custom_id"], "error": f"no answer after {sent[line['custom_id']]} "
         f"send(s); the last: {why}"}
        for line, why in client.unanswered if sent[line["custom_id"]] > cap]
    folder = run.batch_folder
    number = batch_submit.last_round(state) + 1
    files = write_request_files(folder, [line for line, _ in again] + client.written,
                                prefix=batch_submit.round_prefix(number))
    failed = folder / "failed.jsonl"
    if final:
        write_atomic(failed, [json.dumps(x) + "\n" for x in final])
    else:
        failed.unlink(missing_ok=True)
    stats.update({"judge/batch_resubmit_requests": len(again) + len(client.written),
                  "judge/batch_refused": len(client.refused),
                  "judge/batch_gave_up": len(final) - len(client.refused)})
    run.write_stats("judge", stats)
    command = f"wim judge {run.path}"
    finals = (f"; {len(final)} failed for good ({summarise(x['error'] for x in final)}), see "
              f"{failed}" if final else "")
    if files:
        pending = Resubmit("judge", lost, stats)
        pending.what = (
            f"{len(again) + len(client.written)} judge request(s) have no answer yet "
            f"({summarise([why for _, why in again] + ['parse retry'] * len(client.written))})"
            f"{finals}")
        pending.args = (
            f"{pending.what}. They are written to {', '.join(map(str, files))} (round "
            f"{number}): send them with `{command} --batch-submit`, then run `{command}` until "
            "it exits 0. The answers taken in are kept and never asked again.",)
        raise pending
    if final:
        raise BatchFailures(
            f"{len(final)} judge request(s) failed for good and are not sent again "
            f"({summarise(x['error'] for x in final)}); see {failed} and stats/judge.json. The "
            f"stages after judge did not run. Once the cause is fixed, judge them live with "
            f"`{command} --set judge.batch=false`, or raise judge.batch_resubmits (now {cap}) "
            "to send the unanswered ones again.")
    if lost:  # parse retries asked live that failed: the same command asks them again
        raise StageIncomplete("judge", lost, stats)
    return stats


def judge_by_batch(cfg: Config, run: RunDir, res, shard: Shard | None, results: list[str] | None,
                   submit: bool, judge_batches) -> dict[str, Any]:
    """The judge stage with judge.batch: write the request files; or take in the answers of
    `results`; or (`submit`) send the newest round's files, take in the ended batches'
    answers, and send the next round at once; or, without `submit`, take them in and stop at
    a new round (nothing is spent without --batch-submit)."""
    check_batch_judge(cfg)  # before a judge is made for another kind of judge
    if results is not None:
        if submit:
            raise WimError("--batch-results and --batch-submit: pass one of them.")
        return judge_in_batch(cfg, run, res, shard, results, judge_batches)
    if submit and not batch_submit.round_files(run, 0):
        try:
            return judge_in_batch(cfg, run, res, shard, None, judge_batches)  # judged already
        except BatchWritten:
            pass
    elif not submit and not batch_submit.submitted_path(run).exists():
        return judge_in_batch(cfg, run, res, shard, None, judge_batches)
    while True:  # ends: a request is sent at most 1 + judge.batch_resubmits times
        if submit:
            batch_submit.submit(cfg, run, batch_submit.round_files(
                run, batch_submit.newest_round(run)))
        outputs = batch_submit.collect(cfg, run)  # BatchesRunning (exit 3) while any runs
        try:
            return judge_in_batch(cfg, run, res, shard, outputs, judge_batches, rounds=True)
        except Resubmit as pending:
            if not submit:
                raise
            logger.info("%s: sending them again", pending.what)
