"""The fixed cost of ``stepscope run``: start-up plus everything after the script's last step until
the prompt returns, part by part, on small public-style scripts.

Scripts (written into a temporary directory; each starts by noting the time of its first line and
ends by noting the time of its last, into the file ``$BENCH_MARKS`` names):

- ``tiny``: a 3-step loop (a Linear, SGD), no DataLoader;
- ``mnist``: pytorch/examples' MNIST net (two convolutions, dropout, Adadelta, ``log_softmax`` +
  ``nll_loss``) on MNIST-shaped random tensors through a ``DataLoader`` (batch 64, 2 worker
  processes), 40 steps; it also notes when its first step starts, so the inside of the script is
  split in two (first line to first step, the steps) and compared as well;
- ``wlm``: ``tests/integration/loop_shapes/word_language_model.py`` (manual SGD, an LSTM, no
  DataLoader).

Each round runs, interleaved and in alternating order: ``python SCRIPT`` and ``stepscope SCRIPT``
as typed (``stepscope run -o DIR --force SCRIPT``, every capture feature on, the summary on
stderr), then the same command with this file's hooks in (``--inner``), which notes when each part
of the end of the run starts and ends: the record saved (``CaptureSession.stop``: the sampler
stopped, the record written), the report pipeline's imports, reading the inputs back
(``inputs_after_run``), the diagnosis, ``report.json``, the run index and the printed summary; and,
with ``--html``, ``report.html``. Times are wall seconds on one clock (``time.time``), from the
driver's ``Popen`` to the first line, and from the last line to the child's exit.

What stepscope adds: start-up = (first line − start) under stepscope minus the same under
python; end = (exit − last line) under stepscope minus the same under python; fixed cost = their
sum. Medians over the rounds.

    python benchmarks/bench_fixed_cost.py [--rounds 5] [--scripts tiny,mnist,wlm] [--html]
        [--src before=OLD/src --src after=NEW/src]

``--src LABEL=DIR`` (repeatable) runs stepscope from each source tree (``PYTHONPATH=DIR``), all
interleaved in the same rounds: a before/after comparison on the same load.

``--memory N`` then runs ``python SCRIPT`` and ``stepscope run`` N more times each, alternating, with
the memory sampled (apart from the timed rounds, whose times it would disturb): the largest single
process (``ru_maxrss`` from ``wait4``: the training process, or a DataLoader worker or the
sampler if larger) and the process tree's summed RSS and proportional set size, sampled 20 and 10
times a second (``bench_analyze.run_command``); the tree includes the DataLoader workers and, under
stepscope, its sampler process. The largest value over the N runs of each.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PROLOGUE = ("import os as _bench_os, time as _bench_time\n"
            "_bench_f = open(_bench_os.environ['BENCH_MARKS'], 'a'); "
            "_bench_f.write(f'first {_bench_time.time()!r} {_bench_time.process_time()!r}\\n'); _bench_f.flush()\n")
EPILOGUE = ("\n_bench_f.write(f'last {_bench_time.time()!r} {_bench_time.process_time()!r}\\n'); "
            "_bench_f.close()\n")

TINY = textwrap.dedent("""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
""")

MNIST = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):  # pytorch/examples mnist/main.py
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(self.dropout1(x), 1)
            x = self.dropout2(F.relu(self.fc1(x)))
            return F.log_softmax(self.fc2(x), dim=1)


    if __name__ == "__main__":
        torch.manual_seed(1)
        torch.set_num_threads(1)
        data = TensorDataset(torch.randn(64 * 40, 1, 28, 28), torch.randint(0, 10, (64 * 40,)))
        loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2)
        model = Net()
        optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
        model.train()
        _bench_f.write(f'loop {_bench_time.time()!r} {_bench_time.process_time()!r}\\n')  # the first step starts
        for images, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), target)
            loss.backward()
            optimizer.step()
""")

#: part name -> (module, attribute path) whose call is timed by ``--inner``
HOOKS = {
    "capture.session": [("CaptureSession.stop", "record saved (session.stop)")],
    "capture.launcher": [("execute", "script")],
    "pipeline.publish": [("inputs_after_run", "inputs read back"), ("diagnose", "diagnosis"),
                         ("save_report", "report.json"), ("print_report", "summary printed")],
    "pipeline.history": [("index_after_run", "run index")],
    "cli.exports": [("export_after_run", "report.html")],
}
PARTS = ("record saved (session.stop)", "report pipeline imports", "inputs read back", "diagnosis", "report.json",
         "run index", "summary printed", "report.html")


def write_scripts(work: Path) -> dict[str, Path]:
    sources = {"tiny": TINY, "mnist": MNIST,
               "wlm": (ROOT / "tests" / "integration" / "loop_shapes" / "word_language_model.py").read_text()}
    out = {}
    for name, source in sources.items():
        path = work / f"{name}.py"
        body = source.lstrip("\n")
        doc = ""
        if body.startswith('"""'):  # keep the docstring first
            end = body.index('"""', 3) + 3
            doc, body = body[:end] + "\n", body[end:]
        path.write_text(doc + PROLOGUE + body + EPILOGUE)
        out[name] = path
    return out


def read_marks(path: Path) -> dict[str, float]:
    """``name`` -> wall time, ``name cpu`` -> the process's CPU time then (the first of a name)."""
    marks: dict[str, float] = {}
    for line in path.read_text().splitlines():
        head, _, cpu = line.rpartition(" ")
        key, _, wall = head.rpartition(" ")
        marks.setdefault(key, float(wall))
        marks.setdefault(f"{key} cpu", float(cpu))
    return marks


def timed(command: list[str], cwd: Path, marks: Path, extra_env: dict[str, str]) -> dict[str, float]:
    marks.write_text("")
    env = dict(os.environ, BENCH_MARKS=str(marks), **extra_env)
    start = time.time()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time()
    out = read_marks(marks)
    out["start"], out["exit"] = start, end
    return out


def inner(argv: list[str]) -> None:
    """Run ``stepscope ARGV`` in this process with the timing hooks installed as the modules load
    (installing them by importing the modules first would move their imports into start-up)."""
    import importlib.abc
    import importlib.machinery

    marks = open(os.environ["BENCH_MARKS"], "a")  # noqa: SIM115 - written until the process ends

    def note(name: str) -> None:
        marks.write(f"{name} {time.time()!r} {time.process_time()!r}\n")
        marks.flush()

    def wrap(owner: object, attribute: str, label: str) -> None:
        original = getattr(owner, attribute)

        def timed_call(*args: object, **kwargs: object) -> object:
            note(f"{label} start")
            try:
                return original(*args, **kwargs)
            finally:
                note(f"{label} end")

        setattr(owner, attribute, timed_call)

    class Hooks(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
            short = name.removeprefix("stepscope.")
            if short not in HOOKS or name == short:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_wrap(module):  # type: ignore[no-untyped-def]
                if short == "pipeline.publish":
                    note("report pipeline imports start")
                exec_module(module)
                if short == "pipeline.publish":
                    note("report pipeline imports end")
                for dotted, label in HOOKS[short]:
                    owner: object = module
                    *outer, attribute = dotted.split(".")
                    for part in outer:
                        owner = getattr(owner, part)
                    wrap(owner, attribute, label)

            spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Hooks())
    sys.argv = ["stepscope", *argv]
    from stepscope.cli.entry import console_main

    console_main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scripts", default="tiny,mnist,wlm")
    parser.add_argument("--html", action="store_true", help="also time `stepscope run --html` (report.html)")
    parser.add_argument("--src", action="append", default=[], metavar="LABEL=DIR",
                        help="run stepscope from this source tree (repeatable; default: the one importable here)")
    parser.add_argument("--memory", type=int, default=0, metavar="N",
                        help="also N runs of each with the memory sampled (peak of the largest process and of the tree)")
    parser.add_argument("--inner", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner is not None:
        inner(args.inner)
        return
    import stepscope

    sources = dict(item.partition("=")[::2] for item in args.src) or {"": ""}
    for directory in sources.values():  # byte-compiled, as an installed package is
        compileall.compile_dir(str(Path(directory) / "stepscope" if directory else Path(stepscope.__file__).parent),
                               quiet=1)
    script_bin = Path(sys.executable).parent / "stepscope"
    stepscope_cmd = [str(script_bin)] if script_bin.is_file() else [sys.executable, "-m", "stepscope"]
    env = {"OMP_NUM_THREADS": "1"}
    html = ["--html"] if args.html else []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env["STEPSCOPE_INDEX"] = str(work / "index.sqlite")  # the user's index stays untouched
        scripts = write_scripts(work)
        marks = work / "marks.txt"
        for name in args.scripts.split(","):
            script = scripts[name]
            variants: dict[str, tuple[list[str], dict[str, str]]] = {"python": ([sys.executable, script.name], env)}
            for label, directory in sources.items():
                tree = dict(env, PYTHONPATH=directory) if directory else env
                variants[f"stepscope{label}"] = ([*stepscope_cmd, "run", "-o", "run", "--force", *html, script.name],
                                                 tree)
                variants[f"parts{label}"] = ([sys.executable, str(Path(__file__).resolve()), "--inner", "run", "-o",
                                              "run2", "--force", *html, script.name], tree)
            for command, command_env in variants.values():
                timed(command, work, marks, command_env)  # page cache, the CPU-peak cache
            runs: dict[str, list[dict[str, float]]] = {key: [] for key in variants}
            for index in range(args.rounds):
                for key in (list(variants) if index % 2 == 0 else list(reversed(variants))):
                    runs[key].append(timed(variants[key][0], work, marks, variants[key][1]))
            for label in sources:
                report(f"{name}{' (' + label + ')' if label else ''}",
                       {"python": runs["python"], "stepscope": runs[f"stepscope{label}"], "parts": runs[f"parts{label}"]})
            if args.memory:
                measured = [key for key in variants if not key.startswith("parts")]
                memory_report(name, measured, [
                    (key, peak_memory(variants[key][0], work, marks, variants[key][1]))
                    for index in range(args.memory)
                    for key in (measured if index % 2 == 0 else list(reversed(measured)))])


def peak_memory(command: list[str], cwd: Path, marks: Path, extra_env: dict[str, str]) -> dict[str, float]:
    """One run's peak memory: the largest process and the tree's summed RSS and PSS (MB)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from bench_analyze import run_command

    marks.write_text("")
    result = run_command(command, dict(extra_env, BENCH_MARKS=str(marks)), os.devnull, tree_rss=True, pss_every=2,
                         cwd=str(cwd))
    if result["exit"] != 0:
        raise SystemExit(f"{' '.join(command)} failed: {result['tail']}")
    return {"largest": result["peak_rss_mb"], "tree_rss": result["tree_rss_mb"], "tree_pss": result["tree_pss_mb"]}


def memory_report(name: str, keys: list[str], runs: list[tuple[str, dict[str, float]]]) -> None:
    peaks = {key: {part: max(run[part] for label, run in runs if label == key) for part in ("largest", "tree_rss", "tree_pss")}
             for key in keys}
    bare = peaks["python"]
    print(f"   peak memory, {name} (largest of {len(runs) // len(keys)} runs each): ")
    for key in keys:
        row = peaks[key]
        added = "" if key == "python" else (f"  => +{row['largest'] - bare['largest']:.0f} MB largest, "
                                            f"+{row['tree_pss'] - bare['tree_pss']:.0f} MB tree PSS")
        print(f"     {key:18s} largest process {row['largest']:6.0f} MB, tree RSS {row['tree_rss']:6.0f} MB, "
              f"tree PSS {row['tree_pss']:6.0f} MB{added}")


def report(name: str, runs: dict[str, list[dict[str, float]]]) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    bare, ours, parts = runs["python"], runs["stepscope"], runs["parts"]
    start_bare = median([r["first"] - r["start"] for r in bare])
    end_bare = median([r["exit"] - r["last"] for r in bare])
    start_ours = median([r["first"] - r["start"] for r in ours])
    end_ours = median([r["exit"] - r["last"] for r in ours])
    total = [(r["exit"] - r["start"]) - (b["exit"] - b["start"]) for r, b in zip(ours, bare)]
    fixed = [((r["first"] - r["start"]) - (b["first"] - b["start"])) + ((r["exit"] - r["last"]) - (b["exit"] - b["last"]))
             for r, b in zip(ours, bare)]
    print(f"== {name}: python {median([r['exit'] - r['start'] for r in bare]):.2f} s, "
          f"stepscope run {median([r['exit'] - r['start'] for r in ours]):.2f} s (medians of {len(bare)})")
    print(f"   start-up: python {start_bare:.3f} s, stepscope {start_ours:.3f} s => +{start_ours - start_bare:.3f} s"
          f" (CPU to the first line: python {median([r['first cpu'] for r in bare]):.3f} s, stepscope "
          f"{median([r['first cpu'] for r in ours]):.3f} s => "
          f"+{median([r['first cpu'] for r in ours]) - median([r['first cpu'] for r in bare]):.3f} s)")
    print(f"   end (last line to exit): python {end_bare:.3f} s, stepscope {end_ours:.3f} s => "
          f"+{end_ours - end_bare:.3f} s")
    print(f"   FIXED COST (start-up + end, median of per-round sums): +{median(fixed):.3f} s; "
          f"whole run +{median(total):.3f} s (median of per-round differences)")
    if all("loop" in r for r in (*bare, *ours)):  # the script marks its first step: the inside, split
        for label, begin, end in (("first line to first step", "first", "loop"), ("the steps", "loop", "last")):
            plain = median([r[end] - r[begin] for r in bare])
            captured = median([r[end] - r[begin] for r in ours])
            print(f"   inside, {label}: python {plain:.3f} s, stepscope {captured:.3f} s => {captured - plain:+.3f} s")
    print("   the end, part by part (hooked run, medians; wall / CPU of the process):")
    cpu_sum = 0.0
    for part in PARTS:
        values = [r[f"{part} end"] - r[f"{part} start"] for r in parts if f"{part} start" in r and f"{part} end" in r]
        cpus = [r[f"{part} end cpu"] - r[f"{part} start cpu"] for r in parts
                if f"{part} start cpu" in r and f"{part} end cpu" in r]
        if values:
            cpu_sum += median(cpus)
            print(f"     {part:32s} {median(values):.3f} s / {median(cpus):.3f} s")
    print(f"     {'sum of the parts, CPU':32s} {cpu_sum:.3f} s")
    tail = [r["exit"] - max(v for k, v in r.items() if k.endswith(" end") and not k.startswith("script"))
            for r in parts if any(k.endswith(" end") for k in r)]
    between = [r["record saved (session.stop) start"] - r["last"] for r in parts
               if "record saved (session.stop) start" in r]
    if between:
        print(f"     {'last line to session.stop':32s} {median(between):.3f} s")
    if tail:
        print(f"     {'after the summary to exit':32s} {median(tail):.3f} s (python's own: {end_bare:.3f} s)")
    print(f"     {'hooked end, last line to exit':32s} {median([r['exit'] - r['last'] for r in parts]):.3f} s", flush=True)


if __name__ == "__main__":
    main()
