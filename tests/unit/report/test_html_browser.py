"""The HTML report in a real headless Chromium: it loads from file:// without errors or network
requests, draws its charts and tables, sorts, and runs no script smuggled in through names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from browser import CHROMIUM, Browser, png_pixels
from html_records import HOSTILE, synthetic_run
from records import report_of as build_report
from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.pipeline.trace_views import trace_views
from stepscope.record.run import PHASES
from stepscope.report.render.html import write_html

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it: apt-get install "
                                                "chromium); the HTML report's browser checks need it"),
    pytest.mark.timeout(180),
]
TRACES = Path(__file__).parents[2] / "data" / "traces"


@pytest.fixture(scope="module")
def browser():
    instance = Browser(width=1280, height=1600)
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("html")
    run = folder / "run.html"
    write_html(build_report(synthetic_run(600)), run)
    trace = folder / "trace.html"
    analysis = analyze_traces(TRACES / "cpu_train.pt.trace.json.gz")
    write_html(build_report(traces=analysis), trace)
    hostile = folder / "hostile.html"
    views = trace_views(analysis, from_window=True)
    rank = views.ranks[0]
    rows = tuple(replace(row, name=HOSTILE) if index < 3 else row for index, row in enumerate(rank.operators))
    views = replace(views, ranks=(replace(rank, operators=rows, operators_shown=rows, path=HOSTILE),))
    run_report = build_report(synthetic_run(80, hostile=True))
    write_html(replace(run_report, traces=views), hostile)
    # `stepscope diff --html` of two runs, one with attack strings in its argv, loaders and findings
    from stepscope.analysis.run.diff import FindingBrief, diff_runs
    from stepscope.pipeline.compare import run_view
    from stepscope.report.render import Output, render

    plain, attacked = synthetic_run(200), synthetic_run(200, hostile=True, seed=3, slow=1.3)
    diff_page = folder / "diff.html"
    render(run_view(diff_runs(plain, attacked, label_a="A", label_b=HOSTILE,
                              findings_b=[FindingBrief("x.y", HOSTILE, "high")]), records=(plain, attacked)),
           "html", Output(path=diff_page))
    return {"run": run, "trace": trace, "hostile": hostile, "diff": diff_page}


def only_local(requests: list[str], page: Path) -> list[str]:
    """Requests other than the page itself and the data: images it embeds."""
    return [url for url in requests if url != page.resolve().as_uri() and not url.startswith("data:")]


@pytest.mark.parametrize("name", ["run", "trace", "hostile", "diff"])
def test_page_loads_offline_without_errors(browser, pages, name):
    browser.open(pages[name], scripted=name != "diff")  # the diff page has no script
    assert browser.errors() == []
    assert only_local(browser.requests(), pages[name]) == []


def test_run_page_draws_charts_and_is_not_blank(browser, pages, tmp_path):
    browser.open(pages["run"])
    assert browser.evaluate("document.querySelectorAll('svg.chart.steps path.phase').length") == len(PHASES)
    assert browser.evaluate("document.querySelectorAll('svg.chart.heatmap image').length") == 1
    assert browser.evaluate("document.querySelectorAll('svg.chart.lines').length") >= 5
    assert browser.evaluate("document.querySelectorAll('#verdict .finding').length") >= 1
    # the heatmap PNG decoded: a loaded SVG <image> has a non-zero box
    assert browser.evaluate("document.querySelector('svg.heatmap image').getBBox().width") > 0
    png = browser.screenshot(scale=0.25)
    (tmp_path / "run.png").write_bytes(png)
    width, height, rows = png_pixels(png)
    assert width > 200 and height > 200
    values = [byte for row in rows[::4] for byte in row[::16]]
    mean = sum(values) / len(values)
    spread = (sum((value - mean) ** 2 for value in values) / len(values)) ** 0.5
    assert spread > 10, f"the screenshot looks blank (pixel spread {spread:.1f})"
    assert len(set(values)) > 20


def test_tables_are_built_sorted_and_filtered(browser, pages):
    browser.open(pages["trace"])
    rows = browser.evaluate("document.querySelectorAll('[data-table=\"ops-r0\"] tbody tr').length")
    assert rows > 5
    first_sorted = browser.evaluate(
        "[...document.querySelectorAll('[data-table=\"ops-r0\"] th')].find(th => th.getAttribute('aria-sort') !== 'none')"
        ".textContent")
    assert first_sorted == "host total"


def column(browser, table: str, index: int) -> list[str]:
    return browser.evaluate(f"[...document.querySelectorAll('[data-table=\"{table}\"] tbody tr')]"
                            f".map(tr => tr.children[{index}].textContent)")


def test_sorting_from_the_url_hash_and_by_clicking(browser, pages):
    browser.open(pages["trace"], "#sort=ops-r0:calls:asc")
    calls = [int(value) for value in column(browser, "ops-r0", 1)]
    assert calls == sorted(calls) and calls[0] < calls[-1]
    browser.evaluate("document.querySelectorAll('[data-table=\"ops-r0\"] th')[1].click()")
    calls = [int(value) for value in column(browser, "ops-r0", 1)]
    assert calls == sorted(calls, reverse=True)
    browser.evaluate("location.hash = '#sort=ops-r0:host_self_us:desc'")
    browser.evaluate("new Promise(resolve => setTimeout(resolve, 50))")
    times = browser.evaluate("[...document.querySelectorAll('[data-table=\"ops-r0\"] tbody tr')]"
                             ".map(tr => tr.children[2].title || tr.children[2].textContent)")
    assert len(times) == len(calls)
    header = browser.evaluate("document.querySelectorAll('[data-table=\"ops-r0\"] th')[2].getAttribute('aria-sort')")
    assert header == "descending"


def test_filtering_from_the_url_hash(browser, pages):
    browser.open(pages["trace"], "#filter=ops-r0:addmm")
    names = column(browser, "ops-r0", 0)
    assert names and all("addmm" in name.lower() for name in names)


def test_injected_markup_does_not_run(browser, pages):
    browser.open(pages["hostile"])
    assert browser.evaluate("document.title") != "pwned"
    assert browser.evaluate("document.title").startswith("stepscope")
    assert browser.evaluate("document.getElementById('injected')") is None
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.evaluate("document.scripts.length") == 2
    # the names are shown, as text
    assert "</script><img src=x" in browser.evaluate("document.body.innerText")
    cells = column(browser, "ops-r0", 0)
    assert any(cell.startswith("</script><img") for cell in cells)
    assert only_local(browser.requests(), pages["hostile"]) == []


def test_a_malformed_hash_is_ignored(browser, pages):
    browser.open(pages["trace"], "#sort=%E0%A4%A")
    assert browser.errors() == []
    assert browser.evaluate("document.querySelectorAll('[data-table=\"ops-r0\"] tbody tr').length") > 5


def test_diff_page_draws_both_runs_and_runs_no_injected_markup(browser, pages):
    browser.open(pages["diff"], scripted=False)
    assert browser.errors() == []
    assert browser.evaluate("document.title") == "stepscope diff"
    assert browser.evaluate("document.getElementById('injected')") is None
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.evaluate("document.scripts.length") == 0
    assert browser.evaluate("document.querySelectorAll('.diff-bar').length") == 2
    assert browser.evaluate("document.querySelectorAll('svg.diff-hist polyline').length") == 2
    assert "</script><img src=x" in browser.evaluate("document.body.innerText")
    assert only_local(browser.requests(), pages["diff"]) == []
