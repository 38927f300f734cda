"""The longest path of the graph, with networkx's ties (so the path is HTA's, not only its length).

Both read the finished graph's edge columns (:meth:`Graph.finish`) and return the path's nodes,
the numbers of its edges and its length."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stepscope.analysis.trace.critical_path.graph import Graph
from stepscope.analysis.trace.critical_path.model import IntArray
from stepscope.traces.links import int_isin

Found = tuple[list[int], list[int], float]


def longest_path_forward(graph: Graph) -> Found | None:
    """The dynamic programme in node order, when every edge goes from a lower node to a higher one
    (nodes are sorted by time: the usual case). Same path length and the same first-added best
    predecessor; among several best ends, the earliest node (networkx's order may pick another of
    equal length). None when some edge goes backwards."""
    n = len(graph)
    us, vs = graph.u, graph.v
    if len(us) and (us >= vs).any():
        return None
    weights = np.maximum(graph.weight, 0.0)
    order = np.argsort(vs, kind="stable")  # each node's incoming edges in the order they were added
    if _exact_in_any_order(weights):
        dist, via, chains = _chains_first(n, us, vs, weights, order)
        end = int(np.argmax(dist)) if n else 0
        return _walk_back_chains(end, us, via, chains, float(dist[end]))
    dist, via = _each_edge(n, us, vs, weights, order)
    end = int(np.argmax(dist)) if n else 0
    return _walk_back(end, us, via, float(dist[end]))


def _exact_in_any_order(weights: np.ndarray) -> bool:
    """Whether every sum of the weights is exact (whole µs, HTA's rounded times, well below 2**53),
    so that a path's length does not depend on the order it is added up in."""
    return bool(np.all(weights == np.floor(weights))) and float(weights.sum()) < 2.0 ** 52


def _each_edge(n: int, us: IntArray, vs: IntArray, weights: np.ndarray, order: IntArray) -> tuple[np.ndarray, IntArray]:
    """The programme edge by edge: a node reached by edges starts below any path (weights are
    >= 0), so its first edge is taken and a later one only when strictly longer."""
    reached = np.zeros(n, dtype=bool)
    reached[vs] = True
    dist = np.where(reached, -1.0, 0.0).tolist()
    via = [-1] * n  # the edge each node is best reached by
    for edge, u, v, w in zip(order.tolist(), us[order].tolist(), vs[order].tolist(), weights[order].tolist()):
        candidate = dist[u] + w
        if candidate > dist[v]:
            dist[v] = candidate
            via[v] = edge
    return np.asarray(dist), np.asarray(via, dtype=np.int64)


class _Chains(NamedTuple):
    """Runs of consecutive nodes each reached only from the one before (most of a thread's walk):
    each node's run's first node, each node's only source (-1: none or several)."""

    run_head: IntArray
    previous: IntArray
    single: np.ndarray


def _chains_first(n: int, us: IntArray, vs: IntArray, weights: np.ndarray,
                  order: IntArray) -> tuple[np.ndarray, IntArray, _Chains]:
    """The same programme, exact sums: a node with one incoming edge is reached by it, so along a
    chain of such nodes the distance is the chain's first node's plus the weights since. Within a
    run of consecutive nodes that is a cumulative sum; between runs, pointer jumping over the runs'
    first nodes; only the nodes reached by several edges are decided edge by edge."""
    node = np.arange(n, dtype=np.int64)
    indegree = np.bincount(vs, minlength=n)
    single = indegree == 1
    first_in = np.full(n, -1, dtype=np.int64)  # each node's first incoming edge
    sorted_v = vs[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_v[1:] != sorted_v[:-1]))) if len(order) else order
    first_in[sorted_v[starts]] = order[starts]
    via = first_in.copy()
    previous = np.where(single, us[np.maximum(first_in, 0)], -1)
    step = np.where(single, weights[np.maximum(first_in, 0)], 0.0)
    continues = single & (previous == node - 1)
    run_head = np.maximum.accumulate(np.where(continues, 0, node))
    sums = np.cumsum(np.where(continues, step, 0.0))
    within = sums - sums[run_head]  # from the run's first node (whole µs: exact)
    heads = np.flatnonzero(~continues)
    slot = np.zeros(n, dtype=np.int64)
    slot[heads] = np.arange(len(heads), dtype=np.int64)
    # a run's first node reached by one edge continues its source's chain
    joins = single[heads]
    source = np.maximum(previous[heads], 0)
    up = np.where(joins, slot[run_head[source]], np.arange(len(heads), dtype=np.int64))
    offset = np.where(joins, within[source] + step[heads], 0.0)
    while True:  # jump: each run's chain's first node, and the weights since
        further = up[up]
        if np.array_equal(further, up):
            break
        offset += offset[up]
        up = further
    of_run = slot[run_head]
    anchor = heads[up[of_run]]
    offset = offset[of_run] + within
    merging = np.flatnonzero(indegree > 1)
    dist = np.zeros(n)  # at each chain's first node: 0 without incoming edges, else decided below
    if len(merging):
        into = int_isin(sorted_v, merging)
        edges, sources, targets = order[into], us[order][into], sorted_v[into]
        span = offset[sources] + weights[edges]  # from the source's anchor
        decided: dict[int, float] = {}  # merging node -> its distance (anchors without: 0)
        chosen: dict[int, int] = {}
        for edge, a, extra, v in zip(edges.tolist(), anchor[sources].tolist(), span.tolist(), targets.tolist()):
            candidate = decided.get(a, 0.0) + extra
            if candidate > decided.get(v, -1.0):
                decided[v] = candidate
                chosen[v] = edge
        at = np.fromiter(decided, dtype=np.int64, count=len(decided))
        dist[at] = np.fromiter(decided.values(), dtype=np.float64, count=len(decided))
        via[at] = np.fromiter((chosen[v] for v in decided), dtype=np.int64, count=len(decided))
    dist = dist[anchor] + offset
    return dist, via, _Chains(run_head, previous, single)


def _walk_back_chains(end: int, sources: IntArray, via: IntArray, chains: _Chains, length: float) -> Found:
    """:func:`_walk_back` by runs: from a node back through its run's consecutive nodes to the
    run's first node, then by that node's only (or best) incoming edge to the next run."""
    run_head = chains.run_head  # non-decreasing: each run's first node once
    heads = run_head[np.flatnonzero(np.concatenate(([True], run_head[1:] != run_head[:-1])))]
    slot = np.zeros(len(via), dtype=np.int64)
    slot[heads] = np.arange(len(heads), dtype=np.int64)
    edge = via[heads]
    next_node = np.where(edge >= 0, sources[np.maximum(edge, 0)], -1)  # where the path goes before each run
    next_slot = np.where(edge >= 0, slot[chains.run_head[np.maximum(next_node, 0)]], -1).tolist()
    next_nodes = next_node.tolist()
    k = int(slot[chains.run_head[end]])
    highs, runs = [end], []
    while k >= 0:
        runs.append(k)
        highs.append(next_nodes[k])
        k = next_slot[k]
    high = np.asarray(highs[:-1], dtype=np.int64)
    lengths = high - heads[np.asarray(runs, dtype=np.int64)] + 1
    firsts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    back = np.repeat(high, lengths) - (np.arange(int(lengths.sum()), dtype=np.int64) - firsts)
    nodes = back[::-1]
    return nodes.tolist(), via[nodes[1:]].tolist(), length


def _walk_back(end: int, sources: IntArray, via: IntArray, length: float) -> Found:
    """The path ending at ``end``, from each node's best edge (``via``, -1 at the start)."""
    before = via[sources].tolist()  # each edge's previous edge on the best path to its source
    edges = []
    edge = int(via[end])
    while edge >= 0:
        edges.append(edge)
        edge = before[edge]
    edges.reverse()
    nodes = [*sources[edges].tolist(), end] if edges else [end]
    return nodes, edges, length


def longest_path(graph: Graph, exact: bool = True) -> Found | None:
    """Longest path by dynamic programming over a topological order; None on a cycle. The order
    and the ties are networkx's (``topological_sort`` by generations, the first-added best
    predecessor, the first best end in that order), so the path is HTA's, not only its length.
    A negative weight counts as 0 (HTA: "nanosecond precision"). ``exact=False`` (default mode)
    takes :func:`longest_path_forward` when it applies.

    The generations are found edge by edge; with whole-µs weights the programme then runs on the
    nodes renumbered in that order (every edge forward: the chains of
    :func:`longest_path_forward`; a node's distance and best edge do not depend on the order, and
    the first best end in the order is the lowest number), otherwise edge by edge as networkx."""
    n = len(graph)
    if n == 0:
        return None
    if not exact:
        found = longest_path_forward(graph)
        if found is not None:
            return found
    order = _generations(n, graph.u, graph.v)
    if order is None:
        return None
    weights = np.maximum(graph.weight, 0.0)
    if _exact_in_any_order(weights):
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        us, vs = rank[graph.u], rank[graph.v]
        dist, via, chains = _chains_first(n, us, vs, weights, np.argsort(vs, kind="stable"))
        end = int(np.argmax(dist))
        nodes, edges, length = _walk_back_chains(end, us, via, chains, float(dist[end]))
        return order[nodes].tolist(), edges, length
    pred: list[list[tuple[int, float, int]]] = [[] for _ in range(n)]
    for edge, (u, v, weight) in enumerate(zip(graph.u.tolist(), graph.v.tolist(), weights.tolist())):
        pred[v].append((u, weight, edge))
    dist_of = [0.0] * n
    best_edge = [-1] * n
    for v in order.tolist():
        best, by = 0.0, -1
        for u, weight, edge in pred[v]:
            candidate = dist_of[u] + weight
            if by < 0 or candidate > best:
                best, by = candidate, edge
        dist_of[v], best_edge[v] = best, by
    last = max(order.tolist(), key=lambda node: dist_of[node])
    return _walk_back(last, graph.u, np.asarray(best_edge, dtype=np.int64), dist_of[last])


def _generations(n: int, us: IntArray, vs: IntArray) -> IntArray | None:
    """networkx's ``topological_sort``: the nodes without incoming edges, then generation by
    generation each node once its last incoming edge is met (a node's successors in the order
    their edges were added). None on a cycle."""
    indegree = np.bincount(vs, minlength=n).tolist()
    by_source = np.argsort(us, kind="stable")
    targets = vs[by_source].tolist()
    bounds = np.searchsorted(us[by_source], np.arange(n + 1)).tolist()
    generation = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while generation:
        order.extend(generation)
        following = []
        for u in generation:
            for w in targets[bounds[u]:bounds[u + 1]]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    following.append(w)
        generation = following
    return np.asarray(order, dtype=np.int64) if len(order) == n else None
