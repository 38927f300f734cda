"""A blind evaluation of stepscope's verdict: random bottlenecks, ground truth by ablation.

    python benchmarks/blind_eval.py [--seed S] [--count 40] [--jobs 1] [--repeats 1] [--keep DIR] [--out FILE]
    python benchmarks/blind_eval.py --seed S --count 5 --dry-run --keep DIR     # generate only

From a seed (default: a fresh one, printed), generates ``--count`` workloads (``blind/generate.py``):
standalone CPU training scripts, each a plain loop with 1-3 bottleneck factors of random size
(``blind/factors.py``: costly samples, slow reads, worker restarts, a GIL-holding thread, tiny ops,
periodic saves, memory growth, GC pressure, a neighbour process, rarely a slow rank under torchrun).
For each workload:

1. **Ground truth** (``blind/truth.py``): the script under plain python, in full and once per factor
   with that factor switched off; the bottleneck is the factor whose removal saves most of the
   script's own mean steady step time (ties within noise all count).
2. **Verdict**: the full workload once under ``stepscope run``; its ``report.json``'s top finding
   and primary prescription, mapped to the factors that change removes (``blind/score.py``,
   ``MAPPING``).
3. **Score**: right, wrong, abstain (healthy / unexplained / no finding), or no bottleneck (no
   factor gains 10 %: not scored); confidently wrong = wrong at confidence >= 80 %.

Prints a row per workload, the summary (accuracy, abstentions, confidently wrong) and the
calibration of confidence (per bucket, how often the top finding was right); ``--out`` writes it
all as JSON. One workload takes (2 + its factors) runs of ~3-15 s on a 2-core machine. The runs
time the machine: run on a quiet one, ``--jobs 1``; results from a loaded machine mean nothing. Each
workload is marked with the cores other processes used while it ran (``others_cores``; from
``blind/quiet.py``'s 0.2 it ran beside other load), and the summary names those workloads.
Never tune stepscope on the seeds you look at: report a fresh seed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blind.factors import FACTORS  # noqa: E402
from blind.generate import Workload, draw_workload, write  # noqa: E402
from blind.quiet import CROWDED_CORES, OthersMeter, others_now  # noqa: E402
from blind.score import read_verdict, score, summarise  # noqa: E402
from blind.truth import RunFailed, ground_truth, run_workload, stepscope_command, stop_all  # noqa: E402

RUN_TIMEOUT_S = 240.0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated evaluation ends its runs as Ctrl-C does
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    allowed = tuple(name for name in (args.factors or list(FACTORS)) if not (args.no_ranks and name == "slow_rank"))
    unknown = sorted(set(allowed) - set(FACTORS))
    if unknown:
        print(f"blind_eval: unknown factor(s) {', '.join(unknown)}; known: {', '.join(FACTORS)}", file=sys.stderr)
        return 2
    print(f"blind evaluation: seed {seed}, {args.count} workloads, factors: {', '.join(allowed)}", flush=True)
    if not args.dry_run and (busy := others_now()) >= CROWDED_CORES:
        print(f"blind_eval: the machine is not quiet: other processes used {busy:.2f} cores over 2 s; the "
              "workloads that run beside such load are marked", file=sys.stderr, flush=True)
    workloads = [draw_workload(seed, index, allowed) for index in range(args.count)]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix=f"blind-eval-{seed}-"))
    try:
        for workload in workloads:
            write(workload, root / workload.name)
        if args.dry_run:
            for workload in workloads:
                print(_describe(workload))
            print(f"scripts in {root}")
            return 0
        rows = _evaluate_all(workloads, root, args)
    except KeyboardInterrupt:
        print("blind_eval: interrupted", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarise(rows)
    summary["beside_other_load"] = [row["name"] for row in rows if crowded(row)]
    print()
    print(render_table(rows))
    print()
    print(render_summary(seed, summary))
    if args.out:
        document = {"kind": "stepscope.blind_eval", "seed": seed, "count": args.count, "factors": list(allowed),
                    "repeats": args.repeats, "summary": summary, "workloads": rows}
        Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
        print(f"written: {args.out}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="the workloads' seed (default: a fresh random one, printed)")
    parser.add_argument("--count", type=int, default=40, help="workloads to generate (default 40)")
    parser.add_argument("--jobs", type=int, default=1, help="workloads evaluated at once (default 1: the runs "
                        "need a quiet machine)")
    parser.add_argument("--repeats", type=int, default=1, help="plain runs per configuration (default 1)")
    parser.add_argument("--keep", metavar="DIR", help="keep the generated workloads (scripts, logs, run "
                        "directories) in DIR")
    parser.add_argument("--out", metavar="FILE", help="write every row and the summary as JSON")
    parser.add_argument("--dry-run", action="store_true", help="generate the scripts only")
    parser.add_argument("--factors", nargs="+", metavar="NAME", help=f"draw only these ({', '.join(FACTORS)})")
    parser.add_argument("--no-ranks", action="store_true", help="no two-rank workloads (slow_rank)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds one run may take")
    return parser


def _evaluate_all(workloads: list[Workload], root: Path, args: argparse.Namespace) -> list[dict]:
    def one(workload: Workload) -> dict:
        row = evaluate(workload, root / workload.name, args.repeats, args.timeout)
        print(render_row(row), flush=True)
        return row

    if args.jobs <= 1:
        return [one(workload) for workload in workloads]  # an interrupt reaches the running one
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        return list(pool.map(one, workloads))
    except KeyboardInterrupt:
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def evaluate(workload: Workload, directory: Path, repeats: int, timeout_s: float) -> dict:
    """Ground truth, verdict and score of one workload, as a JSON row."""
    started = time.perf_counter()
    row: dict = {**workload.to_dict(), "directory": str(directory)}
    meter = OthersMeter()
    try:
        truth = ground_truth(workload, directory, repeats, timeout_s)
        out = "stepscope-run"
        shutil.rmtree(directory / out, ignore_errors=True)
        wall, _ = run_workload(workload, directory, stepscope_command(workload, out), (), "stepscope", timeout_s)
        report = json.loads((directory / out / "report.json").read_text())
    except (RunFailed, OSError, ValueError) as error:
        return {**row, "outcome": "error", "error": str(error), "elapsed_s": round(time.perf_counter() - started, 1)}
    row["others_cores"] = round(meter.cores(), 3)
    verdict = read_verdict(report)
    result = score(truth, verdict)
    findings = report.get("findings") or []
    return {**row, "truth": truth.to_dict(), "verdict": verdict.to_dict(),
            "findings": [f"{item.get('rule_id')} {item.get('confidence')}" for item in findings[:4]],
            "stepscope_wall_s": round(wall, 2), "stepscope_steady_ms": _steady_ms(report),
            "outcome": result.outcome, "confidently_wrong": result.confidently_wrong,
            "elapsed_s": round(time.perf_counter() - started, 1)}


def crowded(row: dict) -> bool:
    """Whether the workload ran beside other processes' load (``blind/quiet.py``)."""
    return row.get("others_cores", 0.0) >= CROWDED_CORES


def _steady_ms(report: dict) -> float | None:
    steady = (report.get("summary") or {}).get("steady_state") or {}
    return round(steady["mean_s"] * 1e3, 3) if steady.get("mean_s") is not None else None


def _describe(workload: Workload) -> str:
    base = workload.base
    return (f"{workload.name}: {', '.join(item.describe() for item in workload.planted)} | MLP {base.features}->"
            f"{base.hidden}x{base.depth}, batch {base.batch}, {base.num_workers} workers, {base.epochs} epochs of "
            f"{base.steps_per_epoch} steps, {base.ranks} rank(s), ~{base.compute_ms():.0f} ms compute")


def render_row(row: dict) -> str:
    """One workload, as it finishes: its factors with their gains, the truth and the verdict."""
    head = f"{row['name']} (seed {row['seed']}): "
    if row["outcome"] == "error":
        return head + f"ERROR {row['error']} [{row['elapsed_s']} s]"
    truth, verdict = row["truth"], row["verdict"]
    gains = "; ".join(f"{_factor_text(item)} {_gain(truth, item['name'])}" for item in row["factors"])
    tied = [name for name in truth["within_noise"] if name != truth["bottleneck"]]
    return (f"{head}full {truth['full']['mean_ms']:.1f} ms ± {truth['full']['sem_ms']:.1f} | {gains}\n"
            f"    truth: {truth['bottleneck'] or '(no bottleneck)'}"
            + (f" (within noise: {', '.join(tied)})" if tied else "")
            + f" | verdict: {verdict['rule_id'] or '(none)'} '{verdict['primary_prescription'][:60]}'"
            f" conf {_pct(verdict['confidence'])} -> {_removes(verdict)} | {row['outcome'].upper()}"
            + (" (confidently wrong)" if row.get("confidently_wrong") else "") + f" [{row['elapsed_s']} s]"
            + (f" BESIDE OTHER LOAD ({row['others_cores']:.2f} cores)" if crowded(row) else ""))


def render_table(rows: list[dict]) -> str:
    lines = ["| workload | factors (sizes) | gain when removed | truth | top finding | confidence | outcome |",
             "| --- | --- | --- | --- | --- | ---: | --- |"]
    for row in rows:
        factors = "; ".join(_factor_text(item) for item in row["factors"])
        if row["outcome"] == "error":
            lines.append(f"| {row['name']} | {factors} | | | error | | error |")
            continue
        truth, verdict = row["truth"], row["verdict"]
        gains = "; ".join(f"{item['name']} {_gain(truth, item['name'])}" for item in row["factors"])
        best = truth["bottleneck"] or "none"
        if len(truth["within_noise"]) > 1:
            best += " (≈ " + ", ".join(truth["within_noise"][1:]) + ")"
        lines.append(f"| {row['name']} | {factors} | {gains} | {best} | {verdict['rule_id'] or '(none)'} → "
                     f"{_removes(verdict)} | {_pct(verdict['confidence'])} | {row['outcome']} |")
    return "\n".join(lines)


def render_summary(seed: int, summary: dict) -> str:
    lines = [f"seed {seed}: {summary['workloads']} workloads, {summary['scored']} scored "
             f"({summary['no_bottleneck']} without a bottleneck, {summary['errors']} failed)",
             f"  right {summary['right']}, wrong {summary['wrong']}, abstain {summary['abstain']}: accuracy "
             f"{_pct(summary['accuracy'])} ({_pct(summary['accuracy_when_answered'])} of the answered), abstentions "
             f"{_pct(summary['abstention_rate'])}",
             f"  confidently wrong (>= 80 %): {summary['confidently_wrong']} "
             f"({_pct(summary['confidently_wrong_rate'])}); top two factors within noise in "
             f"{summary['top_within_noise']}",
             "  calibration (answered verdicts by confidence):",
             "  | confidence | verdicts | right | right share | mean confidence |",
             "  | --- | ---: | ---: | ---: | ---: |"]
    for bucket in summary["calibration"]:
        lines.append(f"  | {bucket['bucket']} | {bucket['verdicts']} | {bucket['right']} | "
                     f"{_pct(bucket['right_share'])} | {_pct(bucket['mean_confidence'])} |")
    beside = summary.get("beside_other_load") or []
    if beside:
        lines.append(f"  NOT BLIND: {len(beside)} workload(s) ran beside other processes using >= {CROWDED_CORES} "
                     f"cores ({', '.join(beside)}); draw them again on a quiet machine (--seed {seed})")
    return "\n".join(lines)


def _factor_text(item: dict) -> str:
    sizes = ",".join(f"{key}={value}" for key, value in item["params"].items())
    return f"{item['name']}({sizes})" if sizes else item["name"]


def _gain(truth: dict, name: str) -> str:
    return f"{truth['gains'][name]:+.0%}"


def _removes(verdict: dict) -> str:
    removes = verdict["removes"]
    if removes is None:
        return "abstain"
    return ", ".join(removes) if removes else "no planted factor"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


if __name__ == "__main__":
    sys.exit(main())
