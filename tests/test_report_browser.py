"""The report in a real browser: headless Chromium loads report.html (of a short real run, and of a synthetic sweep)
with no console error, and every figure is drawn: a box with the plot's pixels in it, one figure per PNG."""

from __future__ import annotations

import shutil
from pathlib import Path

import browser
import pytest
from PIL import Image

from rlvr import plots, report

PACKAGE = "chromium"  # the Debian package (binary /usr/bin/chromium)


@pytest.fixture(scope="module")
def chromium_binary() -> str:
    binary = shutil.which("chromium")
    if binary is None:  # `make test` installs it (make browser) where it can: as root, with apt-get
        pytest.skip(f"needs Chromium: install the Debian package `{PACKAGE}` (make browser, or apt-get install -y {PACKAGE})")
    return binary


@pytest.fixture(scope="module")
def real_report(short_run, tmp_path_factory) -> Path:
    """The report of a short real DAPO run (conftest.short_run: 2 steps, evaluations at every step)."""
    out = tmp_path_factory.mktemp("report") / "real"
    assert report.main([str(short_run), "--out", str(out)]) == 0
    return out


def check_rendered(folder: Path, binary: str, group_color: str) -> browser.Capture:
    """Open folder/report.html; no console errors; each figure has a box, and in its plot's box many non-background
    pixels, several colours, and lines in the first group's colour. The screenshot is kept beside the folder."""
    capture = browser.capture(folder / "report.html", folder.parent / f"{folder.name}-screenshot.png", binary)
    assert capture.errors == []
    pngs = sorted((folder / "plots").glob("*.png"))
    assert len(capture.figures) == len(pngs) > 0
    assert sorted(f["id"] for f in capture.figures) == sorted(f"fig-{p.stem}" for p in pngs)
    with Image.open(capture.screenshot) as shot:
        image = shot.convert("RGB")
    assert image.size == (browser.WIDTH, capture.page_height)  # one screenshot pixel per CSS pixel
    color = tuple(int(group_color[i : i + 2], 16) for i in (1, 3, 5))
    for figure in capture.figures:
        box, svg = figure["box"], figure["svg"]
        assert min(box["width"], box["height"]) > 100 and svg and min(svg["width"], svg["height"]) > 100, figure
        left, top = round(svg["x"]), round(svg["y"])
        plot = image.crop((left, top, left + round(svg["width"]), top + round(svg["height"])))
        counts = plot.getcolors(plot.width * plot.height)
        background = max(counts)[1]
        drawn = sum(n for n, c in counts if c != background)
        in_color = sum(n for n, c in counts if max(abs(a - b) for a, b in zip(c, color)) < 40)
        assert drawn > 0.02 * plot.width * plot.height and len(counts) > 10, (figure["id"], drawn, len(counts))
        assert in_color > 50, (figure["id"], in_color)  # the data, not only axes and text
    return capture


def test_real_run_report_renders_in_chromium(real_report, chromium_binary):
    capture = check_rendered(real_report, chromium_binary, plots.COLORS[0])
    ids = {f["id"] for f in capture.figures}
    assert {"fig-accuracy", "fig-accuracy_wallclock", "fig-reward", "fig-clip_frac", "fig-timing"} <= ids


def test_synthetic_sweep_report_renders_in_chromium(tmp_path, chromium_binary):
    from test_report import recipe_sweep

    root = recipe_sweep(tmp_path / "sweep")
    assert report.main([str(root)]) == 0
    capture = check_rendered(root, chromium_binary, plots.COLORS[0])
    # pass@k too; not the tool calls' (these runs have no tools)
    assert len(capture.figures) == len([p for p in plots.PLOTS if p.name not in ("tool_calls", "env_turns", "env_success")]) + 1


def test_the_client_reports_console_errors_and_failed_loads(tmp_path, chromium_binary):
    """The check above means something: the client does see what goes wrong in a page."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><figure id="f"><img src="missing.png"></figure>'
                    '<script>console.error("boom"); notDefined();</script></body></html>')
    errors = browser.capture(page, tmp_path / "bad.png", chromium_binary).errors
    assert any("boom" in e for e in errors) and any("ReferenceError" in e for e in errors)
    assert any("missing.png" in e for e in errors)
