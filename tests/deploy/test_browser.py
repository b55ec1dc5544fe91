"""The HTML reports in a real headless browser (Chromium from Debian's packages): each page
loads with no console error or uncaught exception, and every plot renders. Screenshots are
kept in the test's folder (and in ``$SERVESIM_ARTIFACTS`` when it is set)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import run

pytest.importorskip("plotly")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="chromium is not installed "
                                "(apt-get install chromium)")
# records console errors and uncaught exceptions in the page's own DOM, where --dump-dom
# shows them (Chromium's log does not say which console messages are errors)
PROBE = ("<script>function __record(m){var e=document.createElement('pre');"
         "e.className='console-error';e.textContent=m;document.documentElement.appendChild(e)}"
         "console.error=function(){__record([].join.call(arguments,' '))};"
         "window.addEventListener('error',function(e){__record(e.message)});</script>")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=15000", "--enable-logging=stderr"]


def browse(page: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran; a screenshot beside it."""
    assert BROWSER is not None
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE, 1),
                      encoding="utf-8")
    dom = subprocess.run([BROWSER, *FLAGS, "--dump-dom", probed.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert "Uncaught" not in dom.stderr
    shot = tmp_path / f"{page.stem}.png"
    subprocess.run([BROWSER, *FLAGS, "--window-size=1280,2400", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SERVESIM_ARTIFACTS"):
        Path(os.environ["SERVESIM_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, os.environ["SERVESIM_ARTIFACTS"])
    return dom.stdout


def rendered_plots(dom: str) -> int:
    assert 'class="console-error"' not in dom, re.findall(r'console-error">([^<]*)', dom)
    plots = re.findall(r'<div[^>]*class="[^"]*js-plotly-plot[^"]*"', dom)  # set by plotly.js
    assert dom.count('<svg class="main-svg"') >= len(plots)  # each drew its SVG
    return len(plots)


def test_the_results_page_renders_without_errors(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    code, _, err = run(capsys, "sweep", "tiny.toml", "--set",
                       "engine.workers.aggregated.parallelism.replicas=1,2", "--set",
                       "traffic.load.requests_per_second=2,8", "-o", "r.json", "-j", "1",
                       "--html", "sweep.html")
    assert code == 0, err
    dom = browse(tmp_path / "sweep.html", tmp_path)
    assert rendered_plots(dom) == 2  # the Pareto front and the latency percentiles
    assert "Pareto front" in dom


def test_the_replay_page_renders_without_errors(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    assert run(capsys, "replay", "tiny.toml", "-o", "rep.json",
               "--requests-out", "req.jsonl")[0] == 0
    assert run(capsys, "report", "rep.json", "--requests", "req.jsonl",
               "-o", "replay.html")[0] == 0
    dom = browse(tmp_path / "replay.html", tmp_path)
    assert rendered_plots(dom) == 2  # the time series and the distributions


def test_the_probe_catches_a_console_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<html><head></head><body><script>console.error('boom')</script>"
                    "</body></html>", encoding="utf-8")
    with pytest.raises(AssertionError, match="boom"):
        rendered_plots(browse(page, tmp_path))
