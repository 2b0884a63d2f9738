"""`rlvr report PATH...`: one self-contained HTML page, and a PNG per plot, from the folders runs wrote.

It reads only what runs wrote down (rlvr.runs: no torch, no vllm), so it starts in a second and can run beside a
training job. Runs whose configs differ only in trainer.seed, trainer.output_dir and logger.* form a group, drawn as
the mean over its seeds with a min-max band.

matplotlib draws each figure twice: as SVG inlined in the page and as a PNG for READMEs and papers. One renderer for
both outputs, so the PNGs are the same pictures as the page. The page has no JavaScript at all, so there is nothing to
load and nothing to fail in the console, and a browser draws a few inline SVGs in milliseconds; matplotlib needs no
CDN and downloads no fonts, so the page opens offline. Text in the SVGs stays text (svg.fonttype none): small files.
"""

from __future__ import annotations

import argparse
import datetime
import html
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from rlvr.plots import COLORS, Figure, Group, render_figures
from rlvr.runs import (
    TARGET_ACCURACY,
    Run,
    find_runs,
    group_runs,
    last_eval_samples,
    legend_labels,
    load_run,
    run_summary,
)

# ---- the page ----


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


COLUMNS = (  # (summarize's key, header, format)
    ("final_accuracy", "final eval/accuracy", "{:.3f}".format),
    ("best_accuracy", "best eval/accuracy", "{:.3f}".format),
    ("time_to_target", f"wall clock to accuracy ≥ {TARGET_ACCURACY:.2f}", _duration),
    ("train_s", "time/train_s", _duration),
    ("reward", "final reward/mean", "{:.3f}".format),
    ("length", "final response_length/mean", "{:.1f}".format),
)


def _cell(numbers: list[float | None], fmt: Any) -> str:
    """mean ± sample std over the runs that have the number; "(k/n runs)" when some do not."""
    present = [x for x in numbers if x is not None]
    if not present:
        return "—"
    text = fmt(statistics.fmean(present))
    if len(present) > 1:
        text += " ± " + fmt(statistics.stdev(present))
    if 1 < len(numbers) != len(present):
        text += f" ({len(present)}/{len(numbers)} runs)"
    return text


def _e(value: Any) -> str:
    return html.escape(str(value))


def _swatch(group: Group) -> str:
    return f'<span class="group"><span class="swatch" style="background:{group.color}"></span>{_e(group.label)}</span>'


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _steps(runs: list[Run]) -> str:
    done = sorted({run.step for run in runs})
    span = str(done[0]) if len(done) == 1 else f"{done[0]}–{done[-1]}"
    return _e(f"{span} / {runs[0].config.get('trainer.max_steps', '?')}")


def _group_table(groups: list[Group]) -> str:
    rows = []
    for g in groups:
        finished = sum(run.finished for run in g.runs)
        status = "finished" if finished == len(g.runs) else f"{finished}/{len(g.runs)} finished"
        numbers = [run_summary(run) for run in g.runs]
        cells = [_e(_cell([n[key] for n in numbers], fmt)) for key, _, fmt in COLUMNS]
        rows.append([_swatch(g), str(len(g.runs)), _steps(g.runs), _e(status), *cells])
    caption = "<p class=note>Over a group's runs: mean ± sample standard deviation.</p>"
    return _table(["group", "runs", "steps", "status", *(h for _, h, _ in COLUMNS)], rows) + caption


def _run_table(groups: list[Group], base: Path) -> str:
    rows = []
    for g in groups:
        for run in g.runs:
            numbers = run_summary(run)
            cells = [_e(_cell([numbers[key]], fmt)) for key, _, fmt in COLUMNS]
            seed = run.config.get("trainer.seed", "?")
            rows.append([_e(_relative(run.path, base)), _swatch(g), _e(seed), _steps([run]), _e(run.status), *cells])
    return _table(["run", "group", "seed", "steps", "status", *(h for _, h, _ in COLUMNS)], rows)


def _failed_section(failed: list[Run], base: Path) -> str:
    if not failed:
        return "<p>None.</p>"
    items = "".join(f"<li><code>{_e(_relative(r.path, base))}</code>: {_e(r.status)}</li>" for r in failed)
    note = "<p class=note>Folders of runs that logged nothing (crashed, or still starting).</p>"
    return f"{note}<ul class=failed>{items}</ul>"


def _relative(path: Path, base: Path) -> str:
    return str(path.relative_to(base)) if path != base and path.is_relative_to(base) else str(path)


def _samples_section(groups: list[Group], base: Path) -> str:
    parts = []
    for g in groups:
        found = last_eval_samples(g.runs)
        if found is None:
            parts.append(f"<h3>{_swatch(g)}</h3><p class=note>No evaluation samples in samples.jsonl.</p>")
            continue
        run, rows = found
        fields = ("prompt", "completion", "gold", "extracted", "outcome")
        cells = [[f"<pre>{_e(row.get(f, ''))}</pre>" for f in fields] for row in rows]
        parts.append(
            f"<h3>{_swatch(g)}</h3><p class=note><code>{_e(_relative(run.path, base))}</code>, evaluation at step "
            f"{_e(rows[0]['step'])}</p>" + _table(list(fields), cells)
        )
    return "".join(parts)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;background:#fafafa;
  max-width:1320px;margin:0 auto;padding:16px 24px}
h1{font-size:22px;margin:8px 0}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 4px}
code{background:#eee;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
.group{display:inline-block;max-width:32em;overflow-wrap:anywhere}  /* a long label (a run's overrides) wraps */
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.note{color:#555;font-size:13px}
.failed{color:#b00020}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px}
figure svg{display:block;width:100%;height:auto}
figcaption{font-size:12px;color:#555;margin-top:4px}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-height:16em;overflow:auto;font-size:12px}
"""


def render_html(groups: list[Group], failed: list[Run], figures: list[Figure], notes: list[str], command: str) -> str:
    """The whole page: inline CSS and SVG, no script, no external resource."""
    paths = [run.path for g in groups for run in g.runs] + [run.path for run in failed]
    base = Path(os.path.commonpath(paths)) if len(paths) > 1 else paths[0].parent
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    plots = "".join(
        f'<figure id="fig-{f.name}">{f.svg}<figcaption><b>{_e(f.title)}.</b> {_e(f.caption)} '
        f'<a href="plots/{f.name}.png">PNG</a></figcaption></figure>'
        for f in figures
    )
    body = [
        f"<h1>rlvr report</h1><p class=note><code>{_e(command)}</code><br>runs under <code>{_e(base)}</code>; "
        f"generated {when}</p>",
        "".join(f"<p class=note>{_e(n)}</p>" for n in notes),
        "<h2>Groups</h2>", _group_table(groups),
        "<h2>Runs</h2>", _run_table(groups, base),
        "<h2>Failed runs</h2>", _failed_section(failed, base),
        f'<h2>Plots</h2><div class="plots">{plots}</div>',
        "<h2>Sample completions</h2>", _samples_section(groups, base),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>rlvr report</title>'
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_report(run_dirs: list[Path], out: Path, command: str) -> list[Path]:
    """out/report.html and out/plots/<name>.png from the run folders; returns the files written."""
    runs = [load_run(path) for path in run_dirs]
    by_config = group_runs([run for run in runs if run.failure is None])
    labels = legend_labels(by_config) if by_config else []
    groups = [Group(r, label, COLORS[i % len(COLORS)]) for i, (r, label) in enumerate(zip(by_config, labels))]
    figures, notes = render_figures(groups, out / "plots")
    page = render_html(groups, [run for run in runs if run.failure is not None], figures, notes, command)
    (out / "report.html").write_text(page, encoding="utf-8")
    return [out / "report.html", *(out / "plots" / f"{f.name}.png" for f in figures)]


def main(argv: list[str]) -> int:
    """`rlvr report PATH... [--out DIR]`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="rlvr report",
        description="One self-contained HTML page (and a PNG per plot) from run folders, sweep folders, or folders "
        "holding them; works while the runs are still training.",
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="a run, a sweep, or a folder of them")
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="folder for report.html and plots/ (default: PATH when there is one, else ./report)"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error (argparse has printed it)
        return int(e.code or 0)
    for path in args.paths:
        if not path.is_dir():
            problem = "is not a folder" if path.exists() else "does not exist"
            print(f"rlvr report: {path} {problem} (give run or sweep folders)", file=sys.stderr)
            return 2
    run_dirs = find_runs(args.paths)
    if not run_dirs:
        where = ", ".join(str(p) for p in args.paths)
        print(f"rlvr report: no runs under {where} (a run folder holds metrics.jsonl, config.yaml or .hydra/)",
              file=sys.stderr)
        return 2
    out = args.out or (args.paths[0] if len(args.paths) == 1 else Path("report"))
    out.mkdir(parents=True, exist_ok=True)
    for path in write_report(run_dirs, out, command=shlex.join(["rlvr", "report", *argv])):
        print(path)
    return 0
