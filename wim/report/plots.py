"""The report's plots (matplotlib, Agg backend, imported lazily): `DIR/plots/*.png`. Each
`plot_*` returns the numbers it drew, read back from the artists (docs/design.md, "The report"),
or None, drawing nothing, when there is nothing to show.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wim.metrics import system_values
from wim.rundir import LOG_HISTORY, PLOTS_FOLDER

SYSTEM_LABELS = {"numeric": "numeric (rating)", "wim": "WIM (similarity)", "mixed": "mixed"}
# Keys of TRL's DPO log history (trl/trainer/dpo_trainer.py) drawn per step.
TRAIN_KEYS = {"loss": "loss", "rewards/margins": "reward margin",
              "rewards/accuracies": "reward accuracy"}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plot_score_distributions(scores: Iterable[dict[str, Any]], zeta: float,
                             path: Path) -> dict[str, Any] | None:
    """Numeric vs WIM (vs mixed) histograms on the 1-10 scale, the paper's key picture: ratings
    pile up on a few integers (hence ties), similarities spread out. Returns {system:
    {"counts": bar heights, "n": samples}}."""
    # The 1-10 values (`x * 5 + 5`) as arrays of doubles: 8 bytes a value, from a stream.
    values: dict[str, array] = {"numeric": array("d"), "wim": array("d"), "mixed": array("d")}
    for record in scores:
        for system, value in system_values(record, zeta, []).items():
            values[system].append(value)
    values = {s: v for s, v in values.items() if v}
    if not values:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(values), figsize=(4 * len(values), 3.2), squeeze=False,
                             sharey=True)
    drawn: dict[str, Any] = {}
    for ax, (system, vals) in zip(axes[0], values.items(), strict=True):
        counts, _, _ = ax.hist(vals, bins=36, range=(1, 10), color="tab:blue")
        label = SYSTEM_LABELS[system] + (f" (zeta={zeta:g})" if system == "mixed" else "")
        ax.set_title(label)
        ax.set_xlabel("score on the 1-10 scale")
        drawn[system] = {"counts": [int(c) for c in counts], "n": len(vals)}
    axes[0][0].set_ylabel("samples")
    save_figure(fig, path)
    return drawn


def plot_rounds(rounds: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """Tie rate and mean absolute delta per system over report.json's `rounds` (bars for one
    round). Returns {"tie_rate": {system label: [rounds, values]}, "delta": {...}}."""
    if not rounds:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    single = len(rounds) == 1
    drawn: dict[str, Any] = {}
    for ax, metric, title in ((axes[0], "tie_rate", "tie rate"),
                              (axes[1], "delta", "mean abs delta (1-10 scale)")):
        drawn[metric] = {}
        for n, system in enumerate(SYSTEM_LABELS):
            points = [(r["round"], r[f"pairs/{metric}/{system}"]) for r in rounds
                      if _finite(r.get(f"pairs/{metric}/{system}"))]
            if not points:
                continue
            xs, ys = (list(v) for v in zip(*points, strict=True))
            label = SYSTEM_LABELS[system]
            if single:
                bars = ax.bar([n], ys, color=f"C{n}", label=label)
                ax.bar_label(bars, fmt="%.2f")
                drawn[metric][label] = [xs, [float(b.get_height()) for b in bars]]
            else:
                line, = ax.plot(xs, ys, marker="o", color=f"C{n}", label=label)
                drawn[metric][label] = [[float(v) for v in line.get_xdata()],
                                        [float(v) for v in line.get_ydata()]]
        ax.set_ylim(bottom=0)
        if single:  # one round: the systems side by side, named on the axis
            ax.set_title(f"{title} (one round)")
            ax.set_xticks(range(len(SYSTEM_LABELS)), list(SYSTEM_LABELS.values()))
            ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the value labels
        else:
            ax.set_title(f"{title} per round")
            ax.set_xlabel("round")
            ax.set_xticks(sorted({r["round"] for r in rounds}))
            if drawn[metric]:
                ax.legend(fontsize="small")
    if not any(drawn.values()):
        plt.close(fig)
        return None
    save_figure(fig, path)
    return drawn


def plot_training(history: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """DPO loss, reward margin and accuracy per step of TRL's log history: the loss starts at
    ln 2 (chosen and rejected equally likely under the reference), a margin above 0 moves toward
    the chosen answers. Returns {key: [steps, values]} for each of TRAIN_KEYS that TRL logged."""
    from matplotlib.ticker import MaxNLocator

    series: dict[str, list[list[float]]] = {}
    for key in TRAIN_KEYS:
        points = [(h["step"], h[key]) for h in history if "step" in h and _finite(h.get(key))]
        if points:
            series[key] = [list(map(float, c)) for c in zip(*points, strict=True)]
    if "loss" not in series:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), 3.2), squeeze=False)
    drawn: dict[str, Any] = {}
    for n, (ax, (key, (steps, values))) in enumerate(zip(axes[0], series.items(),
                                                         strict=True)):
        line, = ax.plot(steps, values, marker="o", color=f"C{n}", label=TRAIN_KEYS[key])
        reference = {"loss": math.log(2), "rewards/margins": 0.0, "rewards/accuracies": 0.5}
        ax.axhline(reference[key], color="grey", linestyle=":", linewidth=1)
        if key == "rewards/accuracies":
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"DPO {TRAIN_KEYS[key]} per step")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        drawn[key] = [[float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]]
    save_figure(fig, path)
    return drawn


def plot_win_rates(comparisons: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """Per comparison of eval.json: win rate (ties half, paired bootstrap 95%) and decisive rate
    (ties out, Clopper-Pearson 95%); no interval where all outcomes are equal. Returns {"names",
    "win_rate", "low", "high", "decisive", "decisive_low", "decisive_high"}, None if not drawn."""
    rows = [c for c in comparisons if _finite(c.get("win_rate"))]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    drawn: dict[str, Any] = {"names": [str(c.get("name")) for c in rows]}
    series = (("win_rate", "bootstrap_95", 0.12, "tab:blue", "o",
               "win rate, ties half (paired bootstrap 95%)", ("win_rate", "low", "high")),
              ("decisive_rate", "decisive_95", -0.12, "tab:orange", "s",
               "decisive rate, ties out (Clopper-Pearson 95%)",
               ("decisive", "decisive_low", "decisive_high")))
    for key, ci_key, dy, color, marker, label, names in series:
        points = []  # (rate, low, high) as drawn, None where not drawn
        for c, y in zip(rows, ys, strict=True):
            ci = c.get(ci_key) if isinstance(c.get(ci_key), (list, tuple)) else None
            if not _finite(c.get(key)):
                points.append((None, None, None))
                continue
            rate = float(c[key])
            err = [[rate - float(ci[0])], [float(ci[1]) - rate]] if ci else None
            line = ax.errorbar([rate], [y + dy], xerr=err, fmt=marker, capsize=4, color=color,
                               label=label)
            label = "_" + label  # one legend entry per series
            # Read back what was drawn: the point, and the ends of its error bar.
            low = high = None
            if ci:
                (start, end), = line.lines[2][0].get_segments()
                low, high = float(start[0]), float(end[0])
            points.append((float(line.lines[0].get_xdata()[0]), low, high))
        drawn.update(zip(names, map(list, zip(*points, strict=True)), strict=True))
    ax.axvline(0.5, color="grey", linestyle=":", label="_even")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{c.get('name', '?')}" for c in rows])
    ax.set_xlim(0, 1)
    ax.set_xlabel("rate of A over B")
    ax.legend(loc="lower right", fontsize="small")
    save_figure(fig, path)
    return drawn


def plot_preferences(comparison: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """One comparison's `weighted.per_prompt`, a column per prompt sorted by p: P(a better) with
    a shown first and b shown first, joined (a long line is position bias), p their mean; the
    mean with its t 95% band. Returns {"p", "p_ab", "p_ba", "mean", "ci95"} as drawn."""
    w = comparison.get("weighted") or {}
    rows = sorted((r for r in w.get("per_prompt") or [] if _finite(r.get("p"))),
                  key=lambda r: r["p"])
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = list(range(len(rows)))
    drawn: dict[str, Any] = {"p": [r["p"] for r in rows], "mean": w.get("preference"),
                             "ci95": w.get("ci95"), "p_ab": [r.get("p_ab") for r in rows],
                             "p_ba": [r.get("p_ba") for r in rows]}
    for x, r in zip(xs, rows, strict=True):
        if _finite(r.get("p_ab")) and _finite(r.get("p_ba")):
            ax.plot([x, x], [r["p_ab"], r["p_ba"]], color="lightgrey", zorder=1)
            ax.scatter([x], [r["p_ab"]], marker="^", color="tab:blue", s=18, zorder=2,
                       label="_a shown first" if x else "a shown first")
            ax.scatter([x], [r["p_ba"]], marker="v", color="tab:orange", s=18, zorder=2,
                       label="_b shown first" if x else "b shown first")
    ax.scatter(xs, drawn["p"], color="black", s=14, zorder=3, label="p (both orders)")
    if _finite(w.get("preference")):
        ci = w.get("ci95")
        if ci:
            ax.axhspan(ci[0], ci[1], color="tab:green", alpha=0.15, label="t 95% interval")
        ax.axhline(w["preference"], color="tab:green", label=f"mean {w['preference']:.3f}")
    ax.axhline(0.5, color="grey", linestyle=":")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks([])
    ax.set_xlabel(f"held-out prompts ({len(rows)}), sorted by p")
    ax.set_ylabel(f"P({comparison.get('a')} better than {comparison.get('b')})")
    ax.legend(loc="upper left", fontsize="small", ncol=3)
    save_figure(fig, path)
    return drawn


# Files this module writes; any other DIR/plots/*.png (a refinement run's quality-against-
# tokens plot, ...) is embedded too, captioned with its file name.
OWN_PLOTS = {
    "preferences.png": "Blind evaluation, primary comparison: each held-out prompt's weighted "
                       "preference in both orders, and the mean with its t 95% interval",
    "score_hist.png": "Score distributions, numeric vs WIM, on the 1-10 scale (x * 5 + 5)",
    "rounds.png": "Tie rate and mean absolute delta per round",
    "train.png": "DPO loss, reward margin and reward accuracy per step (TRL log history)",
    "win_rates.png": "Blind evaluation: win rate (ties half, paired bootstrap 95%) and "
                     "decisive rate (ties out, Clopper-Pearson 95%)",
}


def make_plots(cfg, run, report: dict[str, Any],
               evaluation: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Draw every plot the run directory has data for; (relative path, caption) of each PNG
    in DIR/plots/, ours first, then any other PNG found there."""
    from wim.records import iter_keyed

    folder = run.file(PLOTS_FOLDER)
    for name in OWN_PLOTS:  # a plot without data this time must not survive from before
        (folder / name).unlink(missing_ok=True)
    plot_score_distributions((r for _, r in iter_keyed(run.scores)), cfg.scoring.zeta,
                             folder / "score_hist.png")
    rounds = report.get("rounds") or [{"round": 0, **{k: v for k, v in report.items()
                                                      if k.startswith("pairs/")}}]
    plot_rounds(rounds, folder / "rounds.png")
    plot_training(training_history(run), folder / "train.png")
    if evaluation:
        plot_win_rates(evaluation.get("comparisons", []), folder / "win_rates.png")
        primary = next((c for c in evaluation.get("comparisons", []) if c.get("primary")), {})
        if plot_preferences(primary, folder / "preferences.png"):
            # The evaluation section leads with it (wim/report/evaluation.py).
            evaluation["picture"] = "plots/preferences.png"
    found = sorted(p.name for p in folder.glob("*.png"))
    ours = [(f"plots/{n}", c) for n, c in OWN_PLOTS.items() if n in found]
    return ours + [(f"plots/{n}", n) for n in found if n not in OWN_PLOTS]


def training_history(run) -> list[dict[str, Any]]:
    """TRL's per-step log: DIR/rounds/<r>/train/log_history.json of every round, steps
    numbered on across rounds, when a multi-round run has them; else DIR/train/log_history.json."""
    files = [p for r in run.round_runs() if r is not run
             and (p := r.train_folder / LOG_HISTORY).is_file()]
    if not files:
        single = run.train_folder / LOG_HISTORY
        return json.loads(single.read_text()) if single.is_file() else []
    history: list[dict[str, Any]] = []
    offset = 0
    for path in files:
        entries = [h for h in json.loads(path.read_text()) if isinstance(h.get("step"), int)]
        history += [{**h, "step": h["step"] + offset} for h in entries]
        offset += max((h["step"] for h in entries), default=0)
    return history
