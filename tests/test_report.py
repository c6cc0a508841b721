"""The HTML report: self-contained, charts inline, skipped cells explained; rendered by a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import offlab_cli
from offlab import report
from offlab.errors import BadInput
from offlab.store import Store
from synthetic_results import make_sweep_run, make_uso_run

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "offlab.db")
    yield s
    s.close()


@pytest.fixture(scope="module")
def uso_html(tmp_path_factory) -> str:
    with Store.open(tmp_path_factory.mktemp("uso") / "offlab.db") as s:
        run, _ = make_uso_run(s, rounds=4)
        return report.build_report(s, run)


def test_report_is_self_contained(uso_html):
    assert uso_html.startswith("<!DOCTYPE html>")
    # Nothing fetched: no remote or protocol-relative src/href, no scripts, no stylesheets, no web fonts.
    links = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", uso_html, flags=re.I)
    assert links and all(link.startswith("#") for link in links), links
    assert not re.search(r"<script|<link\b|@import|url\((?!#)|@font-face", uso_html, flags=re.I)
    assert "<?xml" not in uso_html and "<!DOCTYPE svg" not in uso_html


def test_report_has_inline_svg_charts_for_metrics_cpu_and_wire(uso_html):
    svgs = re.findall(r"<svg\b[^>]*>", uso_html)
    # 6 headline metrics + stacked CPU + frame-size grid
    assert len(svgs) == 8
    assert all('class="chart"' in s for s in svgs)
    assert uso_html.count("</svg>") == 8
    for section in ('id="summary"', 'id="cells"', 'id="charts"', 'id="cpu"', 'id="wire"', 'id="environment"',
                    'id="plan"'):
        assert section in uso_html
    # the bars' legend names the hue axis (the baseline's axis) and the groups are the payloads
    charts = uso_html[uso_html.index('id="charts"'):uso_html.index('id="cpu"')]
    assert ">offload</text>" in charts
    assert "payload=1472@1500" in uso_html


def test_report_names_skipped_cells_with_reasons_and_shows_verdicts(uso_html):
    attention = uso_html[uso_html.index('id="attention"'):uso_html.index('id="environment"')]
    assert "payload=65507@1500,offload=on" in attention
    assert "tx-udp-segmentation is [fixed] off on olu0a: cannot test here" in attention
    summary = uso_html[uso_html.index('id="summary"'):uso_html.index('id="cells"')]
    assert "faster" in summary and "lower (better)" in summary
    assert re.search(r"\+4\d\.\d %", summary)  # offload on: ~+48 % throughput at 1472 bytes
    assert "99 % CI" in summary


def test_report_shows_environment_offload_table_captures_and_plan(uso_html):
    assert "6.1.0-18-amd64" in uso_html and "Intel(R) Xeon(R) CPU E5-2680 v3" in uso_html
    env = uso_html[uso_html.index('id="environment"'):uso_html.index('id="plan"')]
    assert "client:olu0a" in env and "off [fixed]" in env and "tx-udp_tnl-segmentation" in env
    wire = uso_html[uso_html.index('id="wire"'):]
    assert "65507-byte datagrams left as 45 IP fragments each" in wire
    assert "GSO/GRO super-packets crossed olu1b unsegmented" in wire
    assert "capture: {on: server, frames: 2000}" in uso_html  # plan text, verbatim


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """A 20-cell size sweep, its report written once, and how long that took."""
    d = tmp_path_factory.mktemp("sweep")
    with Store.open(d / "offlab.db") as s:
        run, _ = make_sweep_run(s, rounds=3)
        t0 = time.monotonic()
        out = report.write_report(s, run, d / "sweep.html")
        return {"elapsed": time.monotonic() - t0, "path": out, "html": out.read_text(), "plan": s.get_run(run)["plan"]}


def test_size_sweep_axis_becomes_line_charts(sweep):
    axes = {"size": ["64", "256", "1024"], "gso": ["off", "on"], "streams": ["1", "2"]}
    lay = report.layout(sweep["plan"], axes, {"gso": "off"})
    assert (lay.x, lay.hue, lay.groups) == ("size", "gso", ["streams"])
    assert report.layout({"report": {"x": "streams"}}, axes, None).x == "streams"
    assert report.layout({}, {"payload": ["1472@1500", "8972@9000", "65507@1500"], "offload": ["off", "on"]},
                         {"offload": "off"}) == report.Layout(None, "offload", ["payload"])
    html = sweep["html"]
    assert "throughput against size" in html
    # confidence not reached is flagged next to the comparison and listed with its detail
    assert "⚠ cell: confidence not reached" in html
    assert "throughput interval 7.1 % of the mean after 10 rounds" in html


def test_twenty_cells_report_in_a_few_seconds(sweep):
    html = sweep["html"]
    cells = html[html.index('id="cells"'):html.index('id="charts"')]
    assert len(re.findall(r"<td>size=\d+,gso=(?:on|off),streams=\d+<details>", cells)) == 20  # one row a cell
    assert sweep["elapsed"] < 8, f"report took {sweep['elapsed']:.1f} s"
    assert sweep["path"].stat().st_size < 1_500_000


def test_report_with_an_unknown_baseline_axis_is_bad_input(store):
    run, _ = make_uso_run(store, rounds=2)
    with pytest.raises(BadInput, match="no axis 'mtu'"):
        report.build_report(store, run, baseline={"mtu": "9000"})


def test_report_cli_writes_the_file(store, tmp_path):
    run, _ = make_uso_run(store, rounds=2)
    out = tmp_path / "out" / "report.html"
    done = offlab_cli("report", str(run), "-o", str(out), "--db", str(tmp_path / "offlab.db"))
    assert done.returncode == 0, done.stderr
    assert out.exists() and f"file://{out}" in done.stdout


def _png_pixels(path: Path) -> np.ndarray:
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    return (img[..., :3] * 255).astype(np.uint8)


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                    reason="chromium is not installed (scripts/install-deps installs it for `make test`)")
def test_report_renders_in_headless_chromium(store, tmp_path):
    run, _ = make_uso_run(store, rounds=3)
    page = report.write_report(store, run, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}", "--dump-dom", "--window-size=1280,2000", f"file://{page}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert shot.exists(), done.stderr[-2000:]
    assert "Uncaught" not in done.stderr and "ERROR:CONSOLE" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.count("<svg") == 8 and "payload=65507@1500,offload=on" in done.stdout
    px = _png_pixels(shot)
    assert px.shape[:2] == (2000, 1280)
    non_white = (px.min(axis=2) < 235).mean()
    packed = (px[..., 0].astype(np.uint32) << 16) | (px[..., 1].astype(np.uint32) << 8) | px[..., 2]
    colours = len(np.unique(packed))
    assert non_white > 0.05, f"only {non_white:.1%} of the page is not white"
    assert colours > 200, f"only {colours} distinct colours: charts did not render"
    # the Okabe–Ito blue of the bars is on the page
    blue = (np.abs(px.astype(int) - (0, 114, 178)).sum(axis=2) < 30).mean()
    assert blue > 0.002
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
