"""The HTML report: self-contained, charts inline, skipped cells explained; rendered by a real browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from offlab import report
from offlab.errors import BadInput
from offlab.store import Store
from synthetic_results import make_pps_run, make_sweep_run, make_uso_run
from tests.helpers import run as offlab_in_process

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
    """A 20-cell size sweep, its report written once."""
    d = tmp_path_factory.mktemp("sweep")
    with Store.open(d / "offlab.db") as s:
        run, _ = make_sweep_run(s, rounds=3)
        out = report.write_report(s, run, d / "sweep.html")
        return {"path": out, "html": out.read_text(), "plan": s.get_run(run)["plan"]}


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
    # (the row carries ⚠ and a footnote number; the note itself is a footnote under the table)
    assert re.search(r'⚠</span><sup class="fn">\d+</sup>', html)
    assert "<li>cell: confidence not reached</li>" in html
    assert "throughput interval 7.1 % of the mean after 10 rounds" in html


def test_twenty_cells_report_one_row_a_cell_in_one_file(sweep):
    # how long a report takes is benchmarks/report_speed's (ratios side by side), not a test's
    html = sweep["html"]
    cells = html[html.index('id="cells"'):html.index('id="charts"')]
    assert len(re.findall(r"<td>size=\d+,gso=(?:on|off),streams=\d+<details>", cells)) == 20  # one row a cell
    assert sweep["path"].stat().st_size < 1_500_000


def test_report_with_an_unknown_baseline_axis_is_bad_input(store):
    run, _ = make_uso_run(store, rounds=2)
    with pytest.raises(BadInput, match="no axis 'mtu'"):
        report.build_report(store, run, baseline={"mtu": "9000"})


def test_report_cli_writes_the_file(store, tmp_path):
    run, _ = make_uso_run(store, rounds=2)
    out = tmp_path / "out" / "report.html"
    done = offlab_in_process("report", str(run), "-o", str(out), "--db", str(tmp_path / "offlab.db"))
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


@pytest.fixture(scope="module")
def pps(tmp_path_factory) -> dict:
    """The pps suite's shape (searches, no loss in the baseline, a cell that failed after measuring)."""
    d = tmp_path_factory.mktemp("pps")
    with Store.open(d / "offlab.db") as s:
        run, _ = make_pps_run(s)
        page = report.write_report(s, run, d / "pps.html")
    return {"db": str(d / "offlab.db"), "run": run, "page": page, "html": page.read_text(), "dir": d}


def _section(html: str, start: str, end: str) -> str:
    return html[html.index(f'id="{start}"'):html.index(f'id="{end}"')]


def _row(html: str, key: str) -> str:
    """The text of the table row whose first cell is `key`."""
    m = re.search(r"<tr[^>]*>\s*<td>" + re.escape(key) + r"(?:<details>.*?</details>)?</td>(.*?)</tr>", html, re.S)
    assert m, f"no row {key}"
    return re.sub(r"<[^>]+>", " ", m.group(1))


def test_failed_cell_shows_why_and_no_figures_in_report_show_and_compare(pps):
    # The failed cell measured two samples (≈ 40 Mbit/s, 100 % client CPU) before failing: none is a result.
    html = pps["html"]
    row = _row(_section(html, "cells", "charts"), "rps=all")
    assert "no figures" in row and "bind: address in use" in row
    assert not re.search(r"bit/s|pps|\d %", row), row
    summary = _section(html, "summary", "cells")
    assert "rps=all" not in summary.split("<table class=\"matrix\">")[-1].split("</table>")[0]
    cpu = _section(html, "cpu", "attention")
    assert "rps=all" not in cpu
    shown = offlab_in_process("results", "show", str(pps["run"]), "--db", pps["db"], env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    line = next(l for l in shown.stdout.splitlines() if l.strip().startswith("rps=all"))
    assert not re.search(r"bit/s|pps|%", line), line
    assert "failed: rps=all: offlab-engine rx exited 1: bind: address in use" in shown.stdout
    compared = offlab_in_process("compare", str(pps["run"]), "--db", pps["db"], env={"COLUMNS": "200"})
    assert compared.returncode == 0, compared.stderr
    assert "failed: rps=all (baseline rps=off): offlab-engine rx exited 1: bind: address in use" in compared.stdout
    assert "rps=all vs" not in compared.stdout


def test_the_reports_searches_and_segments_are_the_stored_records_with_their_cell(pps):
    from offlab.sample import Segment, ZeroLossSearch, records

    with Store.open(pps["db"], create=False) as s:
        cells, rows = s.cells(pps["run"]), s.samples(pps["run"])
    keys = {c["id"]: c["key"] for c in cells}
    found = report.searches(cells, records(rows))
    assert found and all(isinstance(r.search, ZeroLossSearch) for r in found)
    for r in found:  # each the search its cell's sample of that round stored, byte for byte
        stored = [x["sample"]["search"] for x in rows
                  if keys[x["cell_id"]] == r.cell and x["round"] == r.round and x["sample"].get("search")]
        assert json.dumps(r.search.to_json()) in [json.dumps(z) for z in stored]
        assert r.criterion == f"≤ {100 * r.search.max_loss:g} % loss"
    segs = report.segmentations(cells, records(rows))
    assert segs and all(isinstance(h, Segment) for c in segs for h in c.hops)
    first = next(x for x in rows if keys[x["cell_id"]] == segs[0].cell and x["sample"].get("segmentation"))
    assert json.dumps([h.to_json() for h in segs[0].hops]) == json.dumps(first["sample"]["segmentation"])


def test_a_search_trials_line_names_the_kernels_drops_by_place_or_why_it_has_none():
    from offlab.cli.results import _trial_text
    from offlab.sample import SearchTrial

    trial = {"phase": "confirm", "target_pps": 126000, "achieved_pps": 125400.0, "received_pps": 125000.0,
             "sent": 1, "received": 1, "loss": 0.0, "passed": True, "generator_limited": False}
    places = {"lost": 12, "places": {"client NOMEM": 3, "server:eth0 SOCKET_RCVBUFF": 9}, "unseen": 2}
    assert _trial_text(SearchTrial.from_json({**trial, "kernel_loss": places})) == (
        "126k→125k 0 % ✓ (confirm) [kernel: server:eth0 SOCKET_RCVBUFF 9, client NOMEM 3, unseen 2]")
    assert _trial_text(SearchTrial.from_json({**trial, "kernel_loss": {"unavailable": None}})).endswith(
        "[kernel: not taken]")
    assert _trial_text(SearchTrial.from_json({**trial, "kernel_loss": {"lost": 0, "places": {}, "unseen": 0}})
                       ).endswith("[kernel: no drop]")
    no_loss = SearchTrial.from_json({**trial, "loss": None, "kernel_loss": None})
    assert _trial_text(no_loss) == "126k→125k loss ? ✓ (confirm)"


def test_zero_loss_headline_with_trials_is_in_the_report_and_the_terminal(pps):
    summary = _section(pps["html"], "summary", "cells")
    assert re.search(r'class="headline">\d+\.\d kpps</span>\s*<br><span class="note">≤ 0 % loss', summary)
    assert "loss exceeded the threshold at" in summary
    # the trials: target vs what the generator really offered
    assert "<th class=\"num\">target pps</th><th class=\"num\">offered pps</th>" in summary
    assert ">3000000</td>" in summary and ">292353</td>" in summary and "generator-limited" in summary
    shown = offlab_in_process("results", "show", str(pps["run"]), "--db", pps["db"], env={"COLUMNS": "200"})
    assert re.search(r"rps=on round \d: \d+\.\d kpps at ≤ 0 % loss", shown.stdout), shown.stdout
    assert "3000k→292k 57 % gen-limited" in shown.stdout
    assert "rps=all round" not in shown.stdout  # a failed cell's search is no headline either


def test_environment_section_is_grouped_without_the_plan_or_pythons_words(pps):
    env = _section(pps["html"], "environment", "plan")
    text = re.sub(r"<[^>]+>", " ", env)
    assert "False" not in text and "None" not in text
    assert "search_low" not in text  # the plan has its own section
    assert "<h3>versions</h3>" in env and "<h3>machine</h3>" in env
    assert re.search(r"<th>ipv6</th><td>no</td>", env) and re.search(r"<th>numa_node</th><td>not recorded</td>", env)
    assert report.env_text(True) == "yes" and report.env_text(None) == "not recorded"


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="chromium is not installed")
def test_summary_table_fits_a_1400_px_window(pps):
    """Layout measured by a real browser: no table of the report is wider than the page at 1400 px."""
    probe = pps["dir"] / "probe.html"
    # The report has no script; this copy gets one that measures the laid-out page into the title.
    measure = ("<script>const w = document.documentElement.clientWidth; const wide = [];"
               "for (const t of document.querySelectorAll('section table')) {"
               "  const r = t.getBoundingClientRect(); if (r.right > w + 1 || t.parentElement.scrollWidth > "
               "  t.parentElement.clientWidth + 1) wide.push(t.className + ':' + Math.round(r.width)); }"
               "document.title = 'WIDE[' + wide.join(',') + ']';</script>")
    probe.write_text(pps["html"].replace("</body>", measure + "</body>"))
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
            "--disable-background-networking", "--disable-component-update",
            f"--user-data-dir={pps['dir'] / 'profile'}", "--window-size=1400,1000", "--dump-dom", f"file://{probe}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    shutil.rmtree(pps["dir"] / "profile", ignore_errors=True)
    title = re.search(r"<title>(.*?)</title>", done.stdout)
    assert title and title.group(1).startswith("WIDE["), done.stderr[-1500:]
    assert title.group(1) == "WIDE[]", f"tables wider than a 1400 px window: {title.group(1)}"
    # long notes of the comparison are numbered footnotes under it, not text inside its columns
    summary = _section(pps["html"], "summary", "cells")
    assert '<ol class="footnotes">' in summary and "<li>baseline mean is 0: change in absolute terms (diff)</li>" in summary


def test_where_the_loss_went_is_in_the_report_and_results_show(pps):
    loss = _section(pps["html"], "loss", "attention")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", loss))
    # two samples of rps=off, 120 lost each: the router's queue explains 200 of 240
    assert "240 of 120000" in text and "router:olr2 qdisc (pfifo) drops 200 83 %" in text
    assert "unexplained 40 17 %" in text
    shown = offlab_in_process("results", "show", str(pps["run"]), "--db", pps["db"], env={"COLUMNS": "200"})
    assert "lost 240 of 120000 datagrams (client Udp OutDatagrams − server Udp InDatagrams)" in shown.stdout
    assert "router:olr2 qdisc (pfifo) drops 200 (83 %): queue full or over its rate" in shown.stdout


def test_segmentation_by_counters_is_in_the_report_and_results_show(pps):
    seg = _section(pps["html"], "segments", "attention")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", seg))
    assert "client:olr0 tx 1512 63880 B 1500 super-packets: not segmented on this hop" in text
    assert "rps=all" not in text  # failed: no figures
    shown = offlab_in_process("results", "show", str(pps["run"]), "--db", pps["db"], env={"COLUMNS": "200"})
    assert "client:olr0 tx: 1512 pkts of avg 63880 B (super-packets: not segmented on this hop)" in shown.stdout


def test_loss_attribution_stored_by_an_older_offlab_still_reads():
    from offlab.report import format as fmt
    from offlab.sample import LossAttribution

    old = {"lost": 40, "places": [{"where": "server Udp RcvbufErrors (socket receive buffer full)", "count": 30,
                                   "share": 0.75}], "unexplained": 10}
    merged = fmt.merge_attributions([LossAttribution.from_json(old)] * 2)
    assert merged.lost == 80 and merged.places[0].count == 60
    assert fmt.loss_lines(merged) == ["lost 80 datagrams",
                                      "  server Udp RcvbufErrors (socket receive buffer full) 60 (75 %)",
                                      "  unexplained 20 (25 %)"]
