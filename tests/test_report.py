"""rlvr report on run folders the tests write: grouping and legend labels, bands, what the figures draw (per group a
line at the mean over seeds and a band from min to max), failed and unfinished runs, a self-contained page, the PNGs,
escaping of model text, and the command's errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from rlvr import plots, report, runs

TRAIN_KEYS = (
    "reward/mean", "reward/correct_frac", "response_length/mean", "response_length/correct_mean",
    "response_length/incorrect_mean", "response_length/truncated_frac", "actor/clip_frac_low", "actor/clip_frac_high",
    "actor/kl", "actor/entropy", "actor/grad_norm", "sampling/rounds", "sampling/kept_group_frac", "timing/rollout_s",
    "timing/update_s", "timing/sync_s", "timing/step_s",
)


def metrics_rows(steps: int, level: float, *, clock: bool = True, pass_at_k: bool = False) -> list[dict]:
    """Step 0 (evaluation only), then training rows; evaluations at even steps and the last. Values grow with
    `level`, so seeds differ."""
    rows = []
    for step in range(steps + 1):
        row: dict = {"step": step}
        if step:
            row.update({key: level + 0.01 * step for key in TRAIN_KEYS})
        if step % 2 == 0 or step == steps:
            row.update({"eval/accuracy": min(1.0, level + 0.1 * step), "eval/no_answer_frac": 0.0})
            if pass_at_k:
                row.update({"eval/pass@1": level, "eval/pass@2": level + 0.1, "eval/pass@4": level + 0.2})
        if clock:
            row.update({"time/elapsed_s": 10.0 + 5.0 * step + level, "time/train_s": 5.0 * step})
        rows.append(row)
    return rows


def make_run(
    folder: Path, *, seed: int = 0, overrides: list[str] | None = None, config: dict | None = None,
    rows: list[dict] | None = None, samples: list[dict] | None = None, finished: bool = True, max_steps: int = 4,
) -> Path:
    """A run folder as training writes it; `config` holds dotted keys that differ from the base config."""
    folder.mkdir(parents=True)
    flat = {"algo.clip_high": 0.2, "algo.kl_coef": 0.0, "algo.advantage": "group_norm", "algo.ratio": "token",
            "algo.epochs": 1, "trainer.seed": seed, "trainer.max_steps": max_steps, "trainer.lr": 3e-4,
            "trainer.output_dir": str(folder), "logger.progress": False, **(config or {})}
    tree: dict = {}
    for key, value in flat.items():
        section, name = key.split(".")
        tree.setdefault(section, {})[name] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))  # schema order, as training writes it
    if overrides is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    rows = metrics_rows(max_steps, 0.1 * seed) if rows is None else rows
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if samples is not None:
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    if finished:
        (folder / "model").mkdir()
    return folder


def sample(step: int, completion: str, kind: str = "eval") -> dict:
    return {"step": step, "kind": kind, "id": f"add-{step}", "prompt": "2+2=", "completion": completion, "gold": "4",
            "extracted": "4", "outcome": "correct", "correct": True, "reward": 1.0, "tokens": 2,
            "finish_reason": "stop"}


def recipe_sweep(root: Path) -> Path:
    """`rlvr train -m recipe=grpo,dapo trainer.seed=0,1` as Hydra lays it out, plus two jobs that crashed."""
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    jobs = [("grpo", 0), ("grpo", 1), ("dapo", 0), ("dapo", 1)]
    for num, (recipe, seed) in enumerate(jobs):
        samples = [sample(0, "5<eos>"), sample(4, "<script>alert(1)</script><eos>"), sample(4, "4<eos>", "train")]
        make_run(root / f"{num}-{recipe}", seed=seed, overrides=[f"recipe={recipe}", f"trainer.seed={seed}",
                 "logger.progress=False"], config={"algo.clip_high": 0.28 if recipe == "dapo" else 0.2},
                 rows=metrics_rows(4, 0.1 * seed + (0.3 if recipe == "dapo" else 0.0), pass_at_k=True), samples=samples)
    (root / "4-gspo" / ".hydra").mkdir(parents=True)  # crashed before its first row
    (root / "4-gspo" / ".hydra" / "overrides.yaml").write_text("- recipe=gspo\n")
    (root / "5-gspo" / ".hydra").mkdir(parents=True)
    (root / "5-gspo" / "metrics.jsonl").write_text("")
    return root


def labels_of(*paths: Path) -> list[str]:
    loaded = [runs.load_run(p) for p in runs.find_runs(paths)]
    return runs.legend_labels(runs.group_runs([r for r in loaded if r.failure is None]))


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    """One report over the recipe sweep (matplotlib takes a few seconds: shared by the tests below)."""
    root = recipe_sweep(tmp_path_factory.mktemp("sweep") / "four_recipes")
    out = root.parent / "out"
    assert report.main([str(root), "--out", str(out)]) == 0
    return root, out, (out / "report.html").read_text()


def test_legend_names_recipes_and_counts_seeds(tmp_path):
    assert labels_of(recipe_sweep(tmp_path / "sweep")) == ["recipe=grpo (2 seeds)", "recipe=dapo (2 seeds)"]


def test_legend_names_the_swept_override(tmp_path):
    for num, lr in enumerate(["1e-4", "3e-4"]):
        make_run(tmp_path / f"{num}", overrides=["recipe=dapo", f"trainer.lr={lr}", "trainer.seed=0"],
                 config={"trainer.lr": float(lr)})
    assert labels_of(tmp_path) == ["trainer.lr=1e-4", "trainer.lr=3e-4"]


def test_legend_without_overrides_names_the_differing_config_key(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / f"a{seed}", seed=seed, config={"algo.clip_high": 0.2})
        make_run(tmp_path / f"b{seed}", seed=seed, config={"algo.clip_high": 0.28})
    assert labels_of(tmp_path) == ["algo.clip_high=0.2 (2 seeds)", "algo.clip_high=0.28 (2 seeds)"]


def test_legend_falls_back_to_config_when_overrides_do_not_tell_groups_apart(tmp_path):
    make_run(tmp_path / "0", overrides=["recipe=dapo"])  # trainer.lr left at its default
    make_run(tmp_path / "1", overrides=["recipe=dapo", "trainer.lr=1e-4"], config={"trainer.lr": 1e-4})
    assert labels_of(tmp_path) == ["trainer.lr=0.0003", "trainer.lr=0.0001"]


def test_legend_names_at_most_three_keys_unless_more_are_needed(tmp_path):
    many = {"algo.clip_high": 0.28, "algo.kl_coef": 0.04, "algo.advantage": "group_center", "algo.ratio": "sequence"}
    make_run(tmp_path / "0")
    make_run(tmp_path / "1", config=many)
    assert labels_of(tmp_path) == [
        "algo.clip_high=0.2 algo.kl_coef=0.0 algo.advantage=group_norm …",
        "algo.clip_high=0.28 algo.kl_coef=0.04 algo.advantage=group_center …",
    ]
    make_run(tmp_path / "2", config={**many, "algo.epochs": 2})  # differs from run 1 only in the 5th key
    labels = labels_of(tmp_path)
    assert labels[1].endswith("algo.epochs=1") and labels[2].endswith("algo.epochs=2") and len(set(labels)) == 3


def test_a_single_group_is_named_by_its_overrides_or_its_folder(tmp_path):
    make_run(tmp_path / "a" / "run", overrides=["recipe=gspo", "trainer.seed=0", "logger.progress=False"])
    assert labels_of(tmp_path / "a") == ["recipe=gspo"]
    make_run(tmp_path / "b" / "my-run")
    assert labels_of(tmp_path / "b") == ["my-run"]


def test_seeds_group_into_mean_and_min_max_band(tmp_path):
    def row(step: int, reward: float | None, elapsed: float | None) -> dict:
        return {"step": step, "reward/mean": reward, "time/elapsed_s": elapsed}

    rows = [  # None: not logged (null, as a NaN would be)
        [row(1, 0.25, 10.0), row(2, 0.5, 20.0), row(3, 0.5, 30.0)],
        [row(1, 0.75, 12.0), row(2, None, 22.0), row(3, 1.0, 34.0)],
        [row(1, 0.5, 14.0), row(2, 0.5, 24.0), row(3, 0.0, None)],
    ]
    for seed, r in enumerate(rows):
        make_run(tmp_path / f"{seed}", seed=seed, rows=r)
    make_run(tmp_path / "other", config={"algo.clip_high": 0.28})
    groups = runs.group_runs([runs.load_run(p) for p in runs.find_runs([tmp_path])])
    assert [len(g) for g in groups] == [3, 1]
    b = runs.band(groups[0], "reward/mean")  # step 2: seed 1 has no reward -> only steps 1 and 3
    assert b.x.tolist() == [1.0, 3.0]
    assert b.mean.tolist() == [0.5, 0.5] and b.lo.tolist() == [0.25, 0.0] and b.hi.tolist() == [0.75, 1.0]
    clock = runs.band(groups[0], "reward/mean", clock=True)  # step 3: seed 2 has no clock -> only step 1
    assert clock.x.tolist() == [12.0] and clock.mean.tolist() == [0.5]


def seed_rows(base: float, seed: int, skip_eval_at: int | None = None) -> list[dict]:
    """Steps 0-6: accuracy at every step (but `skip_eval_at`), reward from step 1. Per step, the seeds' values all
    differ (offsets (7 seed + 3 step) mod 5) and do not move together, so mean, min and max are three curves."""
    rows = []
    for step in range(7):
        value = base + 0.05 * ((7 * seed + 3 * step) % 5)
        row: dict = {"step": step, "time/elapsed_s": 10.0 + 5.0 * step}
        if step != skip_eval_at:
            row["eval/accuracy"] = value
        if step:
            row["reward/mean"] = value + 0.01 * step
        rows.append(row)
    return rows


def expected_band(per_seed: list[list[dict]], key: str) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
    """Worked out here from the rows, not by rlvr.runs: the steps every seed logged `key` at, mean, min, max."""
    steps = sorted(set.intersection(*({r["step"] for r in rows if key in r} for rows in per_seed)))
    v = np.array([[next(r[key] for r in rows if r["step"] == s) for s in steps] for rows in per_seed])
    return [float(s) for s in steps], v.sum(0) / len(per_seed), v.min(0), v.max(0)


@pytest.fixture(scope="module")
def drawn_figures(tmp_path_factory):
    """A report over two groups (3 seeds, 2 seeds): the matplotlib figures it draws, by name, and each group's rows
    (in the report's group order)."""
    root = tmp_path_factory.mktemp("drawn") / "sweep"
    per_group = [[seed_rows(0.1, s, skip_eval_at=3 if s == 2 else None) for s in range(3)],
                 [seed_rows(0.5, s) for s in range(2)]]
    for g, (clip, group_rows) in enumerate(zip((0.2, 0.28), per_group)):
        for seed, rows in enumerate(group_rows):
            make_run(root / f"{g}-{seed}", seed=seed, config={"algo.clip_high": clip}, rows=rows, max_steps=6)
    drawn: dict = {}
    save = plots._save

    def keep(fig, name, plots_dir):
        drawn[name] = fig
        return save(fig, name, plots_dir)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "_save", keep)
        assert report.main([str(root), "--out", str(root.parent / "out")]) == 0
    return drawn, per_group


def curves_of(fig) -> tuple[dict, dict]:
    """The figure's one axes: its lines and its bands (fill_between), each by colour (hex)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_hex

    (ax,) = fig.axes
    lines: dict = {}
    for line in ax.get_lines():
        lines.setdefault(to_hex(line.get_color()), []).append(line)
    bands: dict = {}
    for c in ax.collections:
        if isinstance(c, PolyCollection):
            bands.setdefault(to_hex(c.get_facecolor()[0][:3]), []).append(c)
    return lines, bands


def assert_band_spans(collection, x: list[float], lo: np.ndarray, hi: np.ndarray) -> None:
    """The band's outline covers exactly x, from lo to hi at each x."""
    points = np.concatenate([p.vertices for p in collection.get_paths()])
    assert sorted(set(points[:, 0].tolist())) == x
    for xi, low, high in zip(x, lo, hi):
        ys = points[points[:, 0] == xi, 1]
        assert (ys.min(), ys.max()) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12)), xi


def test_every_group_is_drawn_as_its_own_line_and_band(drawn_figures):
    drawn, per_group = drawn_figures
    colors = list(plots.COLORS[: len(per_group)])
    assert {"accuracy", "accuracy_wallclock", "reward"} <= set(drawn)
    for name, fig in drawn.items():
        lines, bands = curves_of(fig)
        # one line (mean) and one band (min-max) per group, in the group's colour
        assert sorted(lines) == sorted(colors) and all(len(v) == 1 for v in lines.values()), (name, lines)
        assert sorted(bands) == sorted(colors) and all(len(v) == 1 for v in bands.values()), (name, bands)


def test_the_line_is_the_mean_over_seeds_and_the_band_min_to_max(drawn_figures):
    drawn, per_group = drawn_figures
    for color, group_rows in zip(plots.COLORS, per_group):
        # evaluations: drawn as logged (step 3: a seed of the first group has no accuracy, so no point there)
        x, mean, lo, hi = expected_band(group_rows, "eval/accuracy")
        assert np.all(lo < mean) and np.all(mean < hi)  # the seeds differ: the three are told apart
        lines, bands = curves_of(drawn["accuracy"])
        (line,), (fill,) = lines[color], bands[color]
        assert line.get_xdata().tolist() == x and line.get_ydata() == pytest.approx(mean, abs=1e-12), color
        assert_band_spans(fill, x, lo, hi)
        # training curves: the same, smoothed
        x, mean, lo, hi = expected_band(group_rows, "reward/mean")
        lines, bands = curves_of(drawn["reward"])
        (line,), (fill,) = lines[color], bands[color]
        smoothed = [runs.smooth(y, plots.SMOOTH_STEPS) for y in (mean, lo, hi)]
        assert line.get_xdata().tolist() == x and line.get_ydata() == pytest.approx(smoothed[0], abs=1e-12), color
        assert_band_spans(fill, x, smoothed[1], smoothed[2])


def test_smoothing_is_a_trailing_moving_average():
    assert runs.smooth(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist() == [1.0, 2.0, 4.0, 6.0]


def test_partial_last_line_is_ignored_and_an_unfinished_run_says_where_it_is(tmp_path):
    run = make_run(tmp_path / "run", finished=False, max_steps=4)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward/me')  # the trainer is writing this line right now
    loaded = runs.load_run(run)
    assert [r["step"] for r in loaded.rows] == [0, 1, 2, 3, 4]
    assert loaded.status == "running or stopped at step 4"
    assert runs.load_run(make_run(tmp_path / "done")).status == "finished"


def test_failed_jobs_are_listed_and_the_others_still_plotted(sweep_report):
    _, out, page = sweep_report
    failed = page.split("<h2>Failed runs</h2>")[1].split("<h2>")[0]
    assert "4-gspo</code>: FAILED: no metrics.jsonl" in failed and "5-gspo</code>: FAILED: no rows" in failed
    assert 'id="fig-accuracy"' in page and (out / "plots" / "accuracy.png").exists()
    assert page.count("finished") >= 4


def test_page_is_self_contained(sweep_report):
    _, _, page = sweep_report
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page.lower() and "@import" not in page and "url(http" not in page
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert "mathdefault" not in page  # log axes' tick labels are plain text, not unparsed mathtext
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # the inline SVGs' ids do not collide


def test_one_valid_png_per_figure(sweep_report):
    _, out, page = sweep_report
    figures = re.findall(r'<figure id="fig-([^"]+)">', page)
    assert sorted(figures) == sorted(p.stem for p in (out / "plots").glob("*.png"))
    # every plot but the tool calls' and the episodes' (these runs have neither: tests/test_tools_run.py and
    # tests/test_envs_run.py draw them), and pass@k
    assert len(figures) == len([p for p in plots.PLOTS if p.name not in ("tool_calls", "env_turns", "env_success")]) + 1
    for name in figures:
        png = out / "plots" / f"{name}.png"
        with Image.open(png) as image:
            assert image.format == "PNG" and image.width > 400 and len(image.getcolors(1 << 16) or range(9)) > 8
        assert png.stat().st_size > 10_000


def test_model_text_is_escaped_and_the_last_evaluation_shown(sweep_report):
    _, _, page = sweep_report
    samples = page.split("<h2>Sample completions</h2>")[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;eos&gt;" in samples
    assert "evaluation at step 4" in samples and "5&lt;eos&gt;" not in samples  # step 0's sample is not the last
    assert "4&lt;eos&gt;" not in samples  # a training sample


def test_tables_show_groups_and_final_numbers(sweep_report):
    _, _, page = sweep_report
    groups = page.split("<h2>Groups</h2>")[1].split("<h2>")[0]
    assert "recipe=grpo (2 seeds)" in groups and "recipe=dapo (2 seeds)" in groups
    # final eval/accuracy (step 4) over two seeds: grpo 0.4 and 0.5, dapo 0.7 and 0.8; mean ± sample std
    assert "0.450 ± 0.071" in groups and "0.750 ± 0.071" in groups


def test_summary_of_a_run(tmp_path):
    numbers = runs.run_summary(runs.load_run(make_run(tmp_path / "run", rows=metrics_rows(4, 0.6))))
    # accuracy 0.6, 0.8, 1.0 at steps 0, 2, 4: the target (0.9) first reached at step 4, 10 + 5 * 4 + 0.6 s in
    assert numbers["final_accuracy"] == 1.0 and numbers["best_accuracy"] == 1.0
    assert numbers["time_to_target"] == pytest.approx(30.6) and numbers["train_s"] == 20.0
    assert numbers["reward"] == pytest.approx(0.64)


def test_old_runs_without_clock_skip_the_wall_clock_plot_with_a_note(tmp_path):
    make_run(tmp_path / "old", rows=[{k: v for k, v in r.items() if not k.startswith(("time/", "sampling/"))}
                                     for r in metrics_rows(3, 0.2, clock=False)], max_steps=3)
    assert report.main([str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert 'id="fig-accuracy_wallclock"' not in page and not (tmp_path / "plots" / "accuracy_wallclock.png").exists()
    assert "Held-out accuracy vs wall clock: not drawn, no run logged eval/accuracy with time/elapsed_s." in page
    assert "no run logged sampling/rounds" in page and 'id="fig-reward"' in page


def test_missing_path_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert report.main([str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_no_runs_exits_2(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "no runs under" in capsys.readouterr().err


def test_odd_folders_are_reported_not_crashed_on(tmp_path, capsys):
    rows = metrics_rows(3, 0.2)
    rows[2] = {"step": 2, "skipped": 1, "reward/mean": float("nan"), "sampling/rounds": 3}  # nothing kept at step 2
    run = make_run(tmp_path / "a", rows=rows, finished=False, max_steps=3)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("[1, 2]\n")  # not a row
    (run / "config.yaml").write_text("algo: {clip_high: [")  # being rewritten
    only_step_0 = make_run(tmp_path / "b", rows=metrics_rows(0, 0.5), finished=False)
    corrupt = make_run(tmp_path / "c")
    (corrupt / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    assert report.main([str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    # a line torn by a kill (a later run's rows after it) is skipped with a note, not the run's failure (issue 51)
    assert "c</code>: FAILED" not in page and [r["step"] for r in runs.load_run(corrupt).rows] == [0, 1]
    assert f"{corrupt / 'metrics.jsonl'} line 2 is not JSON" in capsys.readouterr().err
    assert "running or stopped at step 3" in page and "running or stopped at step 0" in page
    assert runs.band([runs.load_run(run)], "reward/mean").x.tolist() == [1.0, 3.0]  # the NaN is left out
    assert runs.load_run(only_step_0).step == 0


def test_dollar_signs_in_labels_are_text_not_math(tmp_path):
    """Config values (a math prompt template) land in legends: matplotlib must not parse `$...$` as math."""
    template = r"{prompt} Put the answer in $\boxed{}$, as in $\frac{$."
    for i, value in enumerate(["{prompt}", template]):
        make_run(tmp_path / "sweep" / f"{i}-dapo", overrides=[f"data.prompt_template={value}"],
                 config={"data.prompt_template": value})
    assert report.main([str(tmp_path / "sweep")]) == 0
    assert "as in $\\frac{$." in (tmp_path / "sweep" / "report.html").read_text()


def test_eval_folders_are_not_runs_and_a_stale_model_is_not_finished(tmp_path):
    run = make_run(tmp_path / "outputs" / "10-00-00-dapo")
    evaluation = tmp_path / "outputs" / "11-00-00-eval"
    (evaluation / ".hydra").mkdir(parents=True)
    (evaluation / "eval.json").write_text("{}")
    assert runs.find_runs([tmp_path / "outputs"]) == [run.resolve()]
    assert runs.load_run(run).finished  # model/ of an old layout: its step is trainer.max_steps (4), the last row's
    (run / "model" / runs.FINAL_STEP_FILE).write_text('{"step": 2}')  # extended after step 2, now at step 4
    assert not runs.load_run(run).finished and runs.load_run(run).status == "running or stopped at step 4"
