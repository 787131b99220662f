"""From responses to pairs: the `judge:`, `scoring:`, `pairs:` and `export:` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wim.config.endpoints import EndpointConfig
from wim.config.sampling import Backend, Dtype, Overlong


@dataclass
class JudgeConfig:
    role: Literal["fixed", "changing", "external"] = "fixed"
    """`fixed` (frozen reference = base policy with any adapter disabled), `changing` (the
    policy being trained) or `external` (`model` below)."""
    model: str | None = None
    """Model for the external judge (`bundled:...`, a folder or a hub id)."""
    backend: Backend = "transformers"
    """Backend of the external judge: `transformers`, `llama_cpp` or `http`."""
    dtype: Dtype = "auto"
    """dtype of an external judge on the transformers backend (see `policy.dtype`)."""
    mode: Literal["wim", "numeric"] = "wim"
    """`wim`: critique of what is missing plus a rating; `numeric`: rating only (cheaper)."""
    prompt: Literal["ours", "authors"] = "ours"
    """`ours`: "Missing: ..." then "Rating: N" (a small judge is walked through it). `authors`:
    theirs, `[[N]]` then `[[[missing]]]` (`[[[]]]`: nothing), instructions in the system turn."""
    on_parse_failure: Literal["exclude", "authors"] = "exclude"
    """`exclude`: a judgement that fails to parse (after retries) gets no score. `authors`: a
    fallback score, as their code (docs/design.md, "Judging")."""
    criteria: str = (
        "accuracy, completeness, and the specific facts, steps or caveats a careful expert "
        "would include"
    )
    """What the judge weighs, written into the judge prompt (set it per dataset)."""
    instructions_in: Literal["system", "user"] = "system"
    """Where the judge instructions go: `system` or `user` message."""
    max_new_tokens: int = 64
    """Most tokens the judge may write per judgement (critique and rating together)."""
    max_retries: int = 2
    """Re-ask a judge whose output fails to parse this many times (sampling, new seed)."""
    retry_temperature: float = 0.7
    """Sampling temperature of the retries (the first attempt is greedy)."""
    batch_size: int = 8
    """Judgements per batch for a local judge."""
    overlong: Overlong = "truncate"
    """Judge input over the judge's context (less max_new_tokens) or max_input_tokens: `truncate`
    (the prompt cut from the middle, the response whole) or `skip` (not judged)."""
    max_input_tokens: int | None = None
    """Cap on judge input tokens below the judge's context; null: none."""
    keep_reasoning: bool = True
    """A reasoning judge's thinking (its `reasoning` field, or its text up to the last
    `</think>`), never parsed as the verdict, is kept in each judgement's `reasoning` field
    (only present when there was some); false: dropped."""
    guided_json: bool = True
    """HTTP judge: ask for the verdict as JSON of the judge's schema (`response_format`), plain
    text where the server refuses it (docs/design.md, "Judging"). false: plain text only."""
    batch: bool = False
    """External http judge: `wim judge` writes OpenAI Batch JSONL requests and stops; `wim judge
    DIR --batch-results OUT...` takes the answers in (docs/design.md, "Judging")."""
    batch_retry: Literal["live", "batch"] = "live"
    """Batch judging: a judgement that fails to parse is asked again `live` (at judge.http), or
    written to DIR/batch/retry-requests-*.jsonl for another batch (`batch`)."""
    batch_resubmits: int = 3
    """`--batch-submit`: times a request the Batch API left without an answer (its batch
    expired, was cancelled or failed; its line a 5xx, 429 or timeout) is sent again, each time
    in the next `--batch-submit`. 3: a request that fails 4 batches in a row is more likely
    broken than unlucky (at a 10% failure rate, 1 in 10,000 is), and each round may wait out
    the API's 24 h window."""
    http: EndpointConfig = field(default_factory=EndpointConfig)
    """The external http judge's own endpoint (`judge.backend: http`), each null field from
    `http:` (fixed and changing judges are the policy and answer where it does)."""


@dataclass
class ScoringConfig:
    zeta: float = 0.4
    """score = (1 - zeta) * rating_norm + zeta * similarity; 1 = pure WIM, 0 = pure numeric."""
    embedder: str = "bundled:all-minilm-l6-v2"
    """sentence-transformers model E: `bundled:all-minilm-l6-v2` (fast), `bundled:all-mpnet-base-v2`
    (the authors' choice, several times slower on a CPU), a local folder or a hub id."""
    report_zetas: list[float] = field(default_factory=lambda: [0.0, 0.4, 1.0])
    """zetas reported side by side (all from one judging pass)."""
    batch_size: int = 64
    """Judgements per scoring batch: their new texts are embedded together, their similarities
    stored and their scores appended to scores.jsonl. With `backend: http`: texts per request,
    and as many batches at once as `scoring.http.concurrency` lets requests be in flight."""
    dtype: Dtype = "auto"
    """The in-process embedder's dtype, by the policy's rule (see `policy.dtype`); similarities
    of another dtype are computed afresh, never mixed with stored ones."""
    backend: Literal["sentence_transformers", "http"] = "sentence_transformers"
    """`sentence_transformers` (in process, on the GPU when there is one) or `http`: an
    OpenAI-compatible `/v1/embeddings` (vLLM `--runner pooling`, TEI, OpenAI) at scoring.http."""
    http: EndpointConfig = field(default_factory=EndpointConfig)
    """With `backend: http`: the embeddings server, field by field as `judge.http` (each null
    field from `http:`; the model name: `scoring.http.model`, else `http.model`)."""


@dataclass
class PairsConfig:
    strategy: Literal["best_vs_worst", "best_vs_random", "all"] = "best_vs_worst"
    """`best_vs_worst`, `best_vs_random` (best vs a random lower one) or `all` (non-tied pairs)."""
    tie_policy: Literal["drop", "first", "random"] = "drop"
    """When the best and worst tie: `drop` the prompt, keep the `first` sample order, or pick
    at `random`."""
    tie_tolerance: float = 1e-6
    """Two samples tie when their scores differ by at most this on the 1-10 scale (`x * 5 + 5`:
    0.5 here is 0.1 on the raw [-1, 1] score). One rule for the pairs and the report."""


@dataclass
class ExportConfig:
    push_to_hub: str | None = None
    """Hub repo id to push DIR/dataset/ to: the pairs (config `default`) and every judged
    response (config `completions`), with the card (needs network and a token)."""
