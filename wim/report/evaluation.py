"""A blind evaluation (eval.json, compare.json) as markdown: eval.md, compare.md and the run
report's section all use these lines, so every page labels each number the same way.

The order is what a reader needs first: the mechanical-numbers warning, the power statement
(can a result of this size be significant at all?), then the pre-specified primary comparison
with its own unadjusted test, then the whole Holm family. Each interval sits beside the rate
it belongs to, with ties in or out said in the label.
"""

from __future__ import annotations

import math
from typing import Any

from wim.markdown import MISSING, fmt_value, markdown_table, md_cell, md_code


def pval(x: Any) -> str:
    """A p-value to 3 significant digits (`fmt_value` for anything else)."""
    return f"{x:.3g}" if isinstance(x, float) and not math.isnan(x) else fmt_value(x)


def interval(x: Any) -> str:
    """A [low, high] pair of numbers; `MISSING` for anything else."""
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return fmt_value([float(v) for v in x])
    return MISSING


def header_lines(doc: dict[str, Any]) -> list[str]:
    """Warnings first: mechanical numbers; a count of hard-verdict fallbacks."""
    lines = []
    if doc.get("mechanical_warning"):
        lines += [f"> **Mechanical numbers.** {md_cell(doc['mechanical_warning'])}", ""]
    if doc.get("hard_fallback"):
        lines += [f"> **Hard-verdict fallback.** {doc['hard_fallback']} prompt(s) got no token "
                  "probabilities from the evaluator's backend in at least one order; that "
                  "order's hard verdict counted as probability 1.", ""]
    return lines


def power_lines(doc: dict[str, Any]) -> list[str]:
    """The sign test's power statement (before the results: the design's ceiling)."""
    if not doc.get("power_statement"):
        return []
    return [f"> **Power.** (sign test) {md_cell(doc['power_statement'])} (min attainable p, one "
            f"comparison: {pval(doc.get('min_attainable_p'))}; Holm over the family: "
            f"{pval(doc.get('min_attainable_p_holm'))}.)", ""]


def _weighted_kind(doc: dict[str, Any]) -> str:
    evaluator = doc.get("evaluator") or {}
    verdict = evaluator.get("verdict", "weighted")
    if verdict == "hard" and evaluator.get("verdict_note"):  # weighted asked, logprobs refused
        return f"{evaluator['verdict_note']}: each order's verdict counted as probability 1"
    if verdict == "hard":
        return ("hard verdicts (blind.verdict hard): each order's verdict counted as "
                "probability 1")
    if verdict == "pointwise":
        return "pointwise scores: 1, 1/2 or 0 per prompt"
    return "the evaluator's probability that a is better, averaged over both orders"


def verdict_sentence(c: dict[str, Any]) -> str:
    """One sentence: what the weighted test of comparison `c` says (at the 0.05 level)."""
    w = c.get("weighted") or {}
    if w.get("preference") is None:
        return "No weighted preference: every verdict failed."
    p = w.get("p_value")
    rate = (f"weighted win rate {fmt_value(w['preference'])} of {md_code(c.get('a'))} over "
            f"{md_code(c.get('b'))}, p = {pval(p)}")
    if p is not None and p < 0.05:
        side = c.get("a") if w["preference"] > 0.5 else c.get("b")
        return f"{md_code(side)} is preferred: {rate} (unadjusted)."
    return f"No significant difference: {rate}."


def weighted_lines(doc: dict[str, Any]) -> list[str]:
    """The lead: the primary comparison's weighted win rate, its interval and its test."""
    prim = next((c for c in doc.get("comparisons", []) if c.get("primary")), None)
    w = (prim or {}).get("weighted")
    if not w:
        return []
    n_family = len(doc.get("comparisons", []))
    src = w.get("sources") or {}
    lines = [f"**{verdict_sentence(prim)}**",
             f"- Weighted win rate of a = {md_code(prim.get('a'))} over b = "
             f"{md_code(prim.get('b'))} ({_weighted_kind(doc)}; n = {w.get('n')} prompts, "
             f"{prim.get('failures')} failed verdicts left out): {fmt_value(w.get('preference'))}, "
             f"t 95% interval of the mean {interval(w.get('ci95'))}, {md_cell(w.get('test'))} "
             f"against 0.5: p = {pval(w.get('p_value'))} (unadjusted; Holm over the "
             f"{n_family} comparison(s): {pval(w.get('p_holm'))}). The interval is the test's "
             "own: p < 0.05 exactly when 0.5 lies outside it."
             + (f" ({md_cell(w['note'])})" if w.get("note") else ""),
             f"- Length-controlled win rate (AlpacaEval 2.0's GLM, its "
             f"`length_controlled_minimal`, fitted on these preferences, length term set to "
             f"zero): {fmt_value(w.get('lc_win_rate'))} (length coefficient "
             f"{fmt_value(w.get('theta_len'))})"
             + (f" ({md_cell(w['lc_note'])})" if w.get("lc_note") else "") + ".",
             "- Where each prompt's preference came from: " + (", ".join(
                 f"{v} {md_cell(k)}" for k, v in src.items()) or "-")
             + (f"; {w.get('hard_fallback')} fell back to a hard verdict in at least one "
                "order (no token probabilities)" if w.get("hard_fallback")
                and (doc.get("evaluator") or {}).get("verdict") == "weighted" else "") + "."]
    if doc.get("weighted_power_statement"):
        lines.append(f"- {md_cell(doc['weighted_power_statement'])}")
    return [x for line in lines for x in (line, "")]


def _ties(c: dict[str, Any]) -> str:
    split = c.get("ties_split") or {}
    if not split:
        return str(c.get("ties", "-"))
    return (f"{c.get('ties')} ({split.get('real', 0)} real, {split.get('order_disagreement', 0)} "
            f"order disagreements, {split.get('identical', 0)} identical answers)")


def primary_lines(doc: dict[str, Any]) -> list[str]:
    """The pre-specified comparison, every number labelled, its own test unadjusted."""
    prim = next((c for c in doc.get("comparisons", []) if c.get("primary")), None)
    if prim is None:
        return []
    n_family = len(doc.get("comparisons", []))
    s = prim.get("sensitivity") or {}
    bootstrap = (f"paired bootstrap 95% {interval(prim.get('bootstrap_95'))}"
                 if prim.get("bootstrap_95")
                 else md_cell(prim.get("bootstrap_note") or "no interval"))
    agree = prim.get("order_agreement")
    agree_text = (f"{fmt_value(agree)}, the share of the {prim.get('orders_compared')} "
                  "prompt(s) asked "
                  "in both orders whose two verdicts named the same answer (low agreement is "
                  "position bias)" if agree is not None else "- (no prompt asked in both orders)")
    lines = [f"**Primary comparison (pre-specified): {md_cell(prim['name'])}** (hard verdicts)",
             f"- a = {md_code(prim.get('a'))}, b = {md_code(prim.get('b'))}; "
             f"n = {prim.get('n')}: "
             f"{prim.get('wins')} wins, {prim.get('losses')} losses, ties {_ties(prim)}, "
             f"{prim.get('failures')} failed verdicts.",
             f"- Sign test, ties left out: decisive rate wins / (wins + losses) = "
             f"{fmt_value(prim.get('decisive_rate'))}, exact Clopper-Pearson 95% "
             f"{interval(prim.get('decisive_95'))}, p = {pval(prim.get('p_value'))} "
             f"(unadjusted; Holm over the {n_family} comparison(s) below: "
             f"{pval(prim.get('p_holm'))}). {md_cell(prim.get('decisive_statement') or '')}",
             f"- Win rate, ties counted as half: {fmt_value(prim.get('win_rate'))}, {bootstrap}.",
             f"- Order agreement: {agree_text}.",
             "- Sensitivity (failed verdicts in, ties half): "
             f"{fmt_value(s.get('failures_as_losses'))} "
             f"with failures as losses, {fmt_value(s.get('failures_as_wins'))} as wins.",
             f"- Length-adjusted win rate (our heuristic on the hard outcomes: an unregularized "
             f"logistic fit with its bootstrap interval; not AlpacaEval's): "
             f"{fmt_value(prim.get('length_adjusted_win_rate'))}, slope "
             f"{fmt_value(prim.get('length_slope'))}, bootstrap 95% "
             f"{interval(prim.get('length_adjusted_95'))}"
             + (f" ({md_cell(prim['length_note'])})" if prim.get("length_note") else "") + "."]
    # One paragraph per line: report.html turns each blank-line block into a paragraph.
    return [x for line in lines for x in (line, "")]


def weighted_table(comparisons: list[dict[str, Any]]) -> list[str]:
    """One row per comparison: the weighted test, its interval, Holm, the LC rate."""
    if not any(c.get("weighted") for c in comparisons):
        return []
    rows = []
    for c in comparisons:
        w = c.get("weighted") or {}
        src = w.get("sources") or {}
        rows.append([
            md_cell(c.get("name", "")) + (" (primary)" if c.get("primary") else ""),
            fmt_value(w.get("n")), fmt_value(w.get("preference")), interval(w.get("ci95")),
            pval(w.get("p_value")), pval(w.get("p_holm")), fmt_value(w.get("lc_win_rate")),
            f"{src.get('guided', 0) + src.get('top_logprobs', 0)} / {src.get('hard', 0)} / "
            f"{src.get('identical', 0)}"])
    return markdown_table(("comparison", "n", "weighted win rate", "t 95% interval", "p",
                           "p (Holm)", "length-controlled (AlpacaEval 2.0 GLM)",
                           "from token probabilities / hard / identical"), rows)


def comparison_table(comparisons: list[dict[str, Any]]) -> list[str]:
    rows = []
    for c in comparisons:
        split = c.get("ties_split") or {}
        ties = " / ".join(str(split.get(k, 0)) for k in ("real", "order_disagreement",
                                                         "identical")) if split else "-"
        s = c.get("sensitivity") or {}
        boot = interval(c.get("bootstrap_95")) if c.get("bootstrap_95") else \
            ("none: all outcomes equal" if "equal" in str(c.get("bootstrap_note")) else "-")
        name = md_cell(c.get("name", "")) + (" (primary)" if c.get("primary") else "")
        rows.append([
            name, fmt_value(c.get("n")),
            " / ".join(fmt_value(c.get(k)) for k in ("wins", "losses", "ties")),
            fmt_value(c.get("failures")), ties, fmt_value(c.get("order_agreement")),
            fmt_value(c.get("decisive_rate")), interval(c.get("decisive_95")),
            pval(c.get("p_value")), pval(c.get("p_holm")), fmt_value(c.get("win_rate")), boot,
            f"{fmt_value(s.get('failures_as_losses'))} / {fmt_value(s.get('failures_as_wins'))}",
            f"{fmt_value(c.get('length_adjusted_win_rate'))} ({fmt_value(c.get('length_slope'))})"])
    return markdown_table(("comparison", "n", "wins / losses / ties", "failures",
                           "ties: real / order disagreement / identical", "order agreement",
                           "decisive rate (ties out)", "Clopper-Pearson 95% (ties out)",
                           "sign-test p (ties out)", "p (Holm)", "win rate (ties half)",
                           "paired bootstrap 95% (ties half)", "failures as losses / as wins",
                           "length-adjusted (slope)"), rows)


LEGEND = ("Sign test: exact two-sided binomial test of wins against losses, ties left out; its "
          "interval is the exact Clopper-Pearson interval of the decisive rate wins / (wins + "
          "losses), so p < 0.05 exactly when 0.5 lies outside it. Win rate: ties counted as "
          "half, with a paired bootstrap interval over prompts (no interval when every outcome "
          "is equal). p (Holm): adjusted over every comparison of the table. Failed verdicts "
          "count for neither side (the sensitivity column counts them as losses, then as "
          "wins). Order agreement: share of prompts asked in both orders where both orders "
          "named the same answer (or both a tie). Length-adjusted: a logistic regression on the "
          "length difference, read at zero; the slope is fitted on these prompts alone.")


def figure_lines(picture: str | None) -> list[str]:
    """The picture of the primary comparison's preferences (wim/report/plots.py)."""
    if not picture:
        return []
    return [f"![Each held-out prompt's preference in both orders (a spread is position bias); "
            f"the mean with its t 95% interval]({picture})", ""]


WEIGHTED_LEGEND = ("Weighted win rate: the mean over prompts of p, the evaluator's "
                   "probability that a is better averaged over both orders (a tie's "
                   "probability split in half); the one-sample t-test of the mean against "
                   "0.5 with its own t interval; p (Holm) over every comparison. "
                   "Length-controlled: AlpacaEval 2.0's length_controlled_minimal GLM on "
                   "the same p, read with the length term at zero.")


def evaluation_body(doc: dict[str, Any], after_lead: list[str] = ()) -> list[str]:
    """In reading order: warnings, the doc's `picture` (a path, set where it was drawn), the
    weighted lead, `after_lead`, the hard-verdict primary comparison, every comparison."""
    comparisons = doc.get("comparisons", [])
    weighted = weighted_table(comparisons)
    return [*header_lines(doc), *figure_lines(doc.get("picture")), *weighted_lines(doc),
            *after_lead,
            *(["**Every comparison, weighted (Holm family)**", "", WEIGHTED_LEGEND, "",
               *weighted, ""] if weighted else []),
            "**Hard verdicts** (each order's verdict text alone; orders that disagree are a "
            "tie)", "", *power_lines(doc), *primary_lines(doc),
            "**Every comparison, hard verdicts (Holm family)**", "", LEGEND, "",
            *comparison_table(comparisons), ""]
