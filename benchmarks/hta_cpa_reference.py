#!/usr/bin/env python3
"""Holistic Trace Analysis' critical path on a Kineto trace, as JSON: the reference that
``tests/data/hta_cpa/`` holds and ``benchmarks/bench_critical_path.py`` times.

Run it with the interpreter of a virtual environment that has HTA installed
(``holistictraceanalysis`` 0.5.0 or ``traceinsight`` 0.6.x; both ship the package ``hta``)::

    /path/to/hta-venv/bin/python benchmarks/hta_cpa_reference.py TRACE \
        --annotation ProfilerStep --instance 0 [--out FILE]

The output names every edge by its two events (name, start, end node), so another implementation's
graph can be compared edge by edge without HTA's dataframe indices: node and edge counts, edge
counts per type, the path's length and edges, the bound-by summary, wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time


def _event(frame, names, ev_idx):
    if ev_idx is None or ev_idx < 0:
        return None
    row = frame.loc[ev_idx]
    return [names[int(row["name"])], int(row["ts"]), int(row["dur"]), int(row["stream"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--annotation", default="ProfilerStep")
    parser.add_argument("--instance", type=int, default=None)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    import hta
    from hta.trace_analysis import TraceAnalysis

    version = getattr(hta, "__version__", None)
    if version is None:
        from importlib.metadata import PackageNotFoundError, version as _v

        for dist in ("traceinsight", "holistictraceanalysis"):
            try:
                version = _v(dist)
                break
            except PackageNotFoundError:
                continue
    workdir = tempfile.mkdtemp()
    try:
        shutil.copy(args.trace, os.path.join(workdir, os.path.basename(args.trace)))
        began = time.perf_counter()
        analyzer = TraceAnalysis(trace_dir=workdir)
        loaded = time.perf_counter()
        rank = next(iter(analyzer.t.traces))  # the trace's own rank (distributedInfo)
        result = analyzer.critical_path_analysis(rank=rank, annotation=args.annotation, instance_id=args.instance)
        done = time.perf_counter()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {"hta_version": version, "trace": os.path.basename(args.trace), "annotation": args.annotation,
           "instance": args.instance, "load_s": loaded - began, "critical_path_s": done - loaded}
    if result is None:
        out["ok"] = False
    else:
        graph, ok = result
        frame = graph.trace_df
        names = analyzer.t.symbol_table.get_sym_table()
        out["ok"] = bool(ok)
        out["nodes"] = graph.number_of_nodes()
        out["edges"] = graph.number_of_edges()
        types = collections.Counter()
        edges = []
        for u, v, data in graph.edges(data=True):
            edge = data["object"]
            types[edge.type.value] += 1
            src, dst = graph.node_list[u], graph.node_list[v]
            edges.append([edge.type.value, int(data["weight"]),
                          _event(frame, names, src.ev_idx) + [bool(src.is_start)],
                          _event(frame, names, dst.ev_idx) + [bool(dst.is_start)]])
        out["edge_types"] = dict(sorted(types.items()))
        out["graph_edges"] = sorted(edges)
        if ok:
            path = []
            for u, v in zip(graph.critical_path_nodes, graph.critical_path_nodes[1:]):
                data = graph.edges[u, v]
                edge = data["object"]
                src, dst = graph.node_list[u], graph.node_list[v]
                path.append([edge.type.value, int(data["weight"]),
                             _event(frame, names, src.ev_idx) + [bool(src.is_start)],
                             _event(frame, names, dst.ev_idx) + [bool(dst.is_start)],
                             _event(frame, names, graph.get_event_attribution_for_edge(edge))])
            out["path"] = path
            out["path_length"] = sum(step[1] for step in path)
            breakdown = graph.get_critical_path_breakdown()
            summary = breakdown.groupby("bound_by").duration.sum()
            out["bound_by_us"] = {str(k): int(v) for k, v in summary.items()}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text = json.dumps(out, indent=1, sort_keys=True)
    if args.out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
