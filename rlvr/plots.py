"""The report's figures: one matplotlib figure per plot, one line (mean over seeds) and band (min-max) per group,
written as a PNG and returned as SVG to inline in the page. One renderer for both, so the PNGs are the page's
pictures; text in the SVG stays text (svg.fonttype none) and math parsing is off (labels are config values, which
may hold `$`).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlvr.runs import Band, Run, band, pass_at_k_band, smooth

SMOOTH_STEPS = 5  # moving average over this many steps for the (noisy) per-step training curves
PNG_DPI = 120
# matplotlib's tab10: one colour per group, the same in every plot and in the tables
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(eq=False)
class Group:
    """Runs with the same config but the seed: one line (mean) and band (min-max) per plot."""

    runs: list[Run]
    label: str
    color: str


XKind = Literal["step", "clock", "k"]
Style = Literal["-", "--", ":"]  # matplotlib's solid, dashed, dotted
Curve = tuple[Group, Style, Band]  # what one line (and band) of a figure draws


@dataclass(frozen=True)
class Plot:
    """One figure: per group, a line (and band) for each key, the keys told apart by line style."""

    name: str  # the figure's id and PNG file name
    title: str
    ylabel: str
    keys: tuple[tuple[str, Style, str], ...]  # (metrics key, line style, what the style stands for)
    evals: bool = False  # evaluation points: markers, never smoothed (training curves are smoothed)
    x: XKind = "step"  # step | clock: time since launch (time/elapsed_s) | k: pass@k against k (the last evaluation)
    log_y: bool = False  # spiky metrics: a log scale (when every value drawn is positive) keeps the usual range visible


def _one(key: str) -> tuple[tuple[str, Style, str], ...]:
    return ((key, "-", ""),)


PLOTS = (
    Plot("accuracy", "Held-out accuracy", "eval/accuracy", _one("eval/accuracy"), evals=True),
    Plot("accuracy_wallclock", "Held-out accuracy vs wall clock", "eval/accuracy", _one("eval/accuracy"), evals=True,
         x="clock"),
    Plot("reward", "Training reward", "reward/mean", _one("reward/mean")),
    Plot("response_length", "Response length", "tokens",
         (("response_length/correct_mean", "-", "correct"), ("response_length/incorrect_mean", "--", "incorrect"))),
    Plot("truncation", "Truncated responses", "response_length/truncated_frac", _one("response_length/truncated_frac")),
    Plot("clip_frac", "Clipped fraction", "fraction of tokens",
         (("actor/clip_frac_high", "-", "high"), ("actor/clip_frac_low", "--", "low"))),
    Plot("kl", "KL to the reference policy", "actor/kl", _one("actor/kl"), log_y=True),
    Plot("entropy", "Policy entropy", "actor/entropy", _one("actor/entropy")),
    Plot("grad_norm", "Gradient norm", "actor/grad_norm", _one("actor/grad_norm"), log_y=True),
    Plot("timing", "Time per step by phase", "seconds",
         (("timing/rollout_s", "-", "rollout"), ("timing/update_s", "--", "update"), ("timing/sync_s", ":", "sync"))),
    Plot("sampling_rounds", "Dynamic-sampling rounds per step", "sampling/rounds", _one("sampling/rounds")),
    Plot("kept_groups", "Kept groups (dynamic sampling)", "sampling/kept_group_frac", _one("sampling/kept_group_frac")),
    Plot("tool_calls", "Tool calls per answer (rollout.tools)", "calls",
         (("tools/calls_per_answer", "-", "all calls"), ("tools/failed_calls_per_answer", "--", "failed"))),
    Plot("env_turns", "Turns per episode (rollout.env)", "env/turns_per_episode", _one("env/turns_per_episode")),
    Plot("env_success", "Episodes that succeeded (rollout.env)", "env/success_frac", _one("env/success_frac")),
)
# drawn when evaluations sampled several answers per prompt (eval/pass@k)
PASS_AT_K = Plot("pass_at_k", "pass@k at the last evaluation", "eval/pass@k", _one("eval/pass@k"), evals=True, x="k")
# where each kind of x axis takes a group's points from: (the group's runs, the metrics key) -> Band
SERIES: dict[str, Callable[[list[Run], str], Band | None]] = {
    "step": lambda runs, key: band(runs, key),
    "clock": lambda runs, key: band(runs, key, clock=True),
    "k": lambda runs, key: pass_at_k_band(runs),
}


# ---- figures ----


@dataclass
class Figure:
    name: str
    title: str
    svg: str  # to inline in the page
    caption: str


def render_figures(groups: list[Group], plots_dir: Path) -> tuple[list[Figure], list[str]]:
    """Draw every plot some group has data for: SVG for the page and plots_dir/<name>.png; notes on those skipped."""
    import matplotlib

    matplotlib.use("Agg")  # no display (pyplot is not used: Figure objects directly; this guards any later import)

    plots_dir.mkdir(parents=True, exist_ok=True)
    figures, notes = [], []
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "rlvr", "font.size": 9, "text.parse_math": False}):
        for plot in (*PLOTS, PASS_AT_K):
            (plots_dir / f"{plot.name}.png").unlink(missing_ok=True)  # no PNG left from an older report
            curves = [(g, style, b) for g in groups for key, style, _ in plot.keys if (b := _band(plot, g, key))]
            if not curves:
                logged = " or ".join(k for k, _, _ in plot.keys) + (" with time/elapsed_s" if plot.x == "clock" else "")
                notes.append(f"{plot.title}: not drawn, no run logged {logged}.")
                continue
            svg = _save(_draw(plot, curves, groups), plot.name, plots_dir)
            figures.append(Figure(plot.name, plot.title, svg, _caption(plot, curves, groups)))
    return figures, notes


def _band(plot: Plot, group: Group, key: str) -> Band | None:
    return SERIES[plot.x](group.runs, key)


def _draw(plot: Plot, curves: list[Curve], groups: list[Group]) -> Any:
    """A matplotlib figure of (group, line style, band) curves, with a legend of groups (and styles) below it."""
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogFormatter

    fig = MplFigure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    scale = 60.0 if plot.x == "clock" and max(b.x.max() for _, _, b in curves) > 600 else 1.0  # minutes past 10 min
    for group, style, b in curves:
        mean, lo, hi = (b.mean, b.lo, b.hi) if plot.evals else (smooth(y, SMOOTH_STEPS) for y in (b.mean, b.lo, b.hi))
        ax.plot(b.x / scale, mean, linestyle=style, color=group.color, marker="o" if plot.evals else None, ms=3)
        if len(group.runs) > 1:
            ax.fill_between(b.x / scale, lo, hi, color=group.color, alpha=0.2, linewidth=0)
    drawn = _drawn(curves, groups)
    handles = [Line2D([], [], color=g.color, label=g.label) for g in drawn]
    wide = max(len(g.label) for g in drawn) > 30
    fig.legend(handles=handles, loc="outside lower center", ncols=1 if wide else min(3, len(handles)), frameon=False)
    if len(plot.keys) > 1:  # what each line style stands for, inside the axes
        ax.legend(handles=[Line2D([], [], color="black", linestyle=ls, label=meaning) for _, ls, meaning in plot.keys])
    ax.set_title(plot.title)
    ax.set_ylabel(plot.ylabel)
    ax.grid(alpha=0.3)
    if _log_scale(plot, curves):
        ax.set_yscale("log")
        # plain tick text: the default log formatters write mathtext ($\mathdefault{10^{2}}$), printed raw here
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    if plot.x == "k":
        ks = sorted({int(k) for _, _, b in curves for k in b.x})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("k")
    else:
        ax.set_xlabel(("wall clock (min)" if scale == 60 else "wall clock (s)") if plot.x == "clock" else "step")
    return fig


def _log_scale(plot: Plot, curves: list[Curve]) -> bool:
    return plot.log_y and all(b.lo.min() > 0 for _, _, b in curves)


def _drawn(curves: list[Curve], groups: list[Group]) -> list[Group]:
    return [g for g in groups if any(c[0] is g for c in curves)]


def _caption(plot: Plot, curves: list[Curve], groups: list[Group]) -> str:
    drawn = _drawn(curves, groups)
    seeds = any(len(g.runs) > 1 for g in drawn)
    parts = ["Line: mean over seeds, at the points every seed has logged; band: min–max over seeds."] if seeds else []
    if plot.x == "k":
        parts.append("At each run's last evaluation that sampled several answers per prompt (x: k, log scale).")
    elif plot.x == "clock":
        parts.append(f"x: time since launch (time/elapsed_s{'; mean over seeds' if seeds else ''}).")
    elif not plot.evals:
        parts.append(f"Moving average over {SMOOTH_STEPS} steps.")
    if _log_scale(plot, curves):
        parts.append("Log scale.")
    if len(plot.keys) > 1:
        names = {"-": "solid", "--": "dashed", ":": "dotted"}
        parts.append("; ".join(f"{names[style]}: {meaning} ({key})" for key, style, meaning in plot.keys) + ".")
    missing = [g.label for g in groups if g not in drawn]
    if missing:
        why = "no time/elapsed_s: runs from before the run clock" if plot.x == "clock" else "nothing logged"
        parts.append(f"Not drawn ({why}): {', '.join(missing)}.")
    return " ".join(parts)


def _save(fig: Any, name: str, plots_dir: Path) -> str:
    """Write the PNG; return the SVG to inline, its ids prefixed with the figure's name (ids are page-wide)."""
    fig.savefig(plots_dir / f"{name}.png", dpi=PNG_DPI)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML prolog or DOCTYPE inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    return re.sub(r'(\bid="|url\(#|href="#)', rf"\g<1>{name}-", svg)
