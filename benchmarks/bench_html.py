"""Benchmark: the HTML report of long runs — render time and file size.

For each run length, a synthetic run (``tests/html_records.py``: 8 cores, two DataLoader workers,
one GPU, samples at 10 Hz over the whole run, a stall every 50 steps) is built once; then, best of
``--repeat``:

- ``report``: :func:`~stepscope.pipeline.diagnose.diagnose` (steady state, signals, diagnosis, the
  view-model — what every output shares);
- ``html``: :func:`~stepscope.report.render.html.render_html` plus writing the file (layout, display
  down-sampling, escaping);
- ``dump``: serialising the run's step columns to JSON (``orjson``), the baseline the HTML is
  compared with in the same run (``html / dump``): a pass over the data any output must make.

Usage::

    python benchmarks/bench_html.py [--steps 1000 10000 100000] [--repeat 3] [--out DIR]

Budget (checked, exit 1 when missed): a 100,000-step run renders in < 2 s to < 5 MB.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent / "tests")]

import orjson  # noqa: E402

from html_records import synthetic_run  # noqa: E402
from records import report_of as build_report  # noqa: E402
from stepscope.report.render.html import write_html  # noqa: E402

BUDGET_S = 2.0
BUDGET_BYTES = 5_000_000


def best(function, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


def measure(steps: int, repeat: int, out: Path) -> dict[str, float]:
    record = synthetic_run(steps)
    report_s, report = best(lambda: build_report(record), repeat)
    path = out / f"run-{steps}.html"

    def html():
        fresh = build_report(record)
        start = time.perf_counter()
        write_html(fresh, path)
        return time.perf_counter() - start

    html_s = min(html() for _ in range(repeat))
    json_s, _ = best(lambda: orjson.dumps(record.steps.columns(), option=orjson.OPT_SERIALIZE_NUMPY), repeat)
    return {"steps": steps, "samples": len(record.samples), "report_s": report_s, "html_s": html_s,
            "json_s": json_s, "bytes": path.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the pages here (default: a temporary folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="stepscope-bench-html-"))
    out.mkdir(parents=True, exist_ok=True)
    print("| steps | samples | build_report | render_html + write | dump steps | html / dump | file |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    failed = False
    for steps in args.steps:
        row = measure(steps, args.repeat, out)
        print(f"| {row['steps']:,} | {row['samples']:,} | {row['report_s']:.2f} s | {row['html_s']:.2f} s | "
              f"{row['json_s'] * 1000:.0f} ms | {row['html_s'] / max(row['json_s'], 1e-9):.0f}× | "
              f"{row['bytes'] / 1e6:.2f} MB |")
        if steps >= 100_000 and (row["html_s"] >= BUDGET_S or row["bytes"] >= BUDGET_BYTES):
            failed = True
    print(f"pages in {out}")
    if failed:
        print(f"over budget: a 100,000-step run must render in < {BUDGET_S} s to < {BUDGET_BYTES / 1e6:.0f} MB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
