"""The `refine:` config section (`wim refine`, wim/refine/), with the names its checks accept:
the criteria, flags and policies that wim/refine imports from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from wim.config.sampling import Backend

CRITERIA = ("factuality", "coherence", "evidence_support", "depth_of_analysis",
            "linguistic_robustness")
"""What the blind outcome evaluator scores (wim/refine/controller.py), each in [0, 1]."""
FLAGS = ("unsupported_claim", "citation_mismatch", "contradiction", "truncated", "empty_answer")
"""Diagnostic flags the fixed rules of wim/refine/evaluator.py can raise (penalty table keys)."""
PolicyName = Literal["none", "hard_cap", "dynamic", "vrr_stop", "vrr_stop_calibrated", "vrr_guard"]
"""Policies derived from one master trajectory (`none` = the initial answer)."""

@dataclass
class RefineDynamicConfig:
    """Dynamic stopping (wim/refine/stopping.py): stop after the first attempt where one fires."""

    reject_streak: int = 3
    """Stop when this many candidates in a row were rejected by the controller."""
    window: int = 3
    """Low progress: attempts over which the retained score must rise ..."""
    min_progress: float = 0.01
    """... by at least this much (aggregate in [0, 1]), else stop."""
    stability_window: int = 3
    """Stability: stop when this many consecutive candidate scores ..."""
    stability_eps: float = 0.01
    """... lie within this range (max - min)."""


@dataclass
class RefineVRRConfig:
    """VRR-Stop and VRR-Guard over the master trajectory (wim/refine/vrr.py)."""

    enabled: bool = True
    """Cast m verifier votes on every answer (the VRR policies need them; costs tokens)."""
    m: int = 8
    """Verifier votes per answer (M)."""
    k: int = 5
    """Most repairs of VRR-Stop, rounds of VRR-Guard (K_max)."""
    tau: float = 0.0
    """VRR-Stop repairs while the gain G = (1 - b) alpha - b beta is above tau."""
    delta: int = 5
    """VRR-Guard replaces the incumbent only if S(new) >= S(incumbent) + delta."""
    prior: float = 0.5
    """Prior probability that the first answer is valid (pi)."""
    rho0: float = 0.2
    """P(a vote accepts | answer invalid) assumed by VRR-Stop."""
    rho1: float = 0.1
    """P(a vote rejects | answer valid) assumed by VRR-Stop."""
    alpha: float = 0.3
    """P(a repair fixes an invalid answer) assumed by VRR-Stop."""
    beta: float = 0.1
    """P(a repair breaks a valid answer) assumed by VRR-Stop."""
    calibrate: bool = True
    """Also run `vrr_stop_calibrated`: rho0, rho1 and the prior estimated by binomial-mixture
    EM over this run's votes (alpha, beta stay as set: they need labels)."""
    j_min: float = 0.2
    """The summary recommends Stop when the calibrated J = 1 - rho0 - rho1 >= j_min, else Guard."""
    vote_temperature: float = 1.0
    """Sampling temperature of the votes (they must differ to be M votes)."""


@dataclass
class RefineConfig:
    """`wim refine`: controlled iterative refinement (wim/refine/)."""

    max_attempts: int = 8
    """Hard cap: attempts of the master trajectory, run once per question."""
    gamma: float = 0.02
    """The controller accepts a candidate only if its aggregate gain is at least gamma."""
    tau_c: float = 0.05
    """... and factuality and evidence support each drop by at most tau_c (critical guard)."""
    critical_guard: bool = True
    """Apply the tau_c guard on factuality and evidence support (ablation switch)."""
    strict: bool = False
    """Strict evaluation: E_L is told to reject unless the answer is clearly correct and
    complete (ablation switch; changes the master trajectory)."""
    ensemble_n: int = 1
    """E_L scores each answer this many times (first greedy, then sampled) and averages the
    criteria; the verdict is the majority (a tie rejects). 1: no ensemble."""
    penalties: dict[str, Any] = field(default_factory=lambda: {
        "unsupported_claim": {"evidence_support": 0.1},
        "citation_mismatch": {"evidence_support": 0.1, "factuality": 0.05},
        "contradiction": {"coherence": 0.1, "factuality": 0.05},
        "truncated": {"linguistic_robustness": 0.1},
        "empty_answer": {"factuality": 1.0, "evidence_support": 1.0},
    })
    """Deterministic diagnostic penalties: flag -> {criterion: amount subtracted}. Flags are
    raised by fixed rules on the answer and E_L's feedback (wim/refine/evaluator.py)."""
    evaluator: str = "same"
    """E_L: `same` (the policy model) or another model (`bundled:...`, a folder, a hub id) for
    the cross-model arm of the 2x2 design."""
    evaluator_backend: Backend = "transformers"
    """Backend of a cross-model E_L: `transformers`, `llama_cpp` or `http` (uses `http:`)."""
    max_retries: int = 2
    """Re-ask an E_L evaluation or vote that fails to parse this many times, then count it."""
    dynamic: RefineDynamicConfig = field(default_factory=RefineDynamicConfig)
    """Dynamic stopping rules and their parameters."""
    vrr: RefineVRRConfig = field(default_factory=RefineVRRConfig)
    """VRR-Stop / VRR-Guard parameters."""
    baseline: PolicyName = "hard_cap"
    """The policy every other one is tested against (paired, Holm-adjusted)."""
    test: Literal["wilcoxon", "ttest"] = "wilcoxon"
    """Paired test: `wilcoxon` (signed rank) or `ttest` (paired t)."""
    pairs_rule: Literal["blind", "accepted", "none"] = "blind"
    """Export (final, initial) as a preference pair when: `blind` (E_B scores the final answer
    higher), `accepted` (the controller accepted a candidate), or `none` (no export)."""
    pairs_policy: PolicyName = "hard_cap"
    """Whose final answer the exported pairs use."""
