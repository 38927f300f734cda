"""The longest path of the graph, with networkx's ties (so the path is HTA's, not only its length).

Both read the finished graph's edge columns (:meth:`Graph.finish`) and return the path's nodes,
the numbers of its edges and its length."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.trace.critical_path.graph import Graph

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
    dist = [0.0] * n
    via = [-1] * n  # the edge each node is best reached by
    back = list(range(n))
    for edge, u, v, w in zip(order.tolist(), us[order].tolist(), vs[order].tolist(), weights[order].tolist()):
        candidate = dist[u] + w
        if via[v] < 0 or candidate > dist[v]:
            dist[v], back[v], via[v] = candidate, u, edge
    end = int(np.argmax(np.asarray(dist))) if n else 0
    return _walk_back(end, back, via, dist[end])


def _walk_back(end: int, back: list[int], via: list[int], length: float) -> Found:
    nodes, edges = [end], []
    while back[nodes[-1]] != nodes[-1]:
        edges.append(via[nodes[-1]])
        nodes.append(back[nodes[-1]])
    nodes.reverse()
    edges.reverse()
    return nodes, edges, length


def longest_path(graph: Graph, exact: bool = True) -> Found | None:
    """Longest path by dynamic programming over a topological order; None on a cycle. The order
    and the ties are networkx's (``topological_sort`` by generations, the first-added best
    predecessor, the first best end in that order), so the path is HTA's, not only its length.
    A negative weight counts as 0 (HTA: "nanosecond precision"). ``exact=False`` (default mode)
    takes :func:`longest_path_forward` when it applies."""
    n = len(graph)
    if n == 0:
        return None
    if not exact:
        found = longest_path_forward(graph)
        if found is not None:
            return found
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[tuple[int, float, int]]] = [[] for _ in range(n)]
    indegree = [0] * n
    weights = np.maximum(graph.weight, 0.0).tolist()
    for edge, (u, v, weight) in enumerate(zip(graph.u.tolist(), graph.v.tolist(), weights)):
        succ[u].append(v)
        pred[v].append((u, weight, edge))
        indegree[v] += 1
    generation = [i for i in range(n) if indegree[i] == 0]
    order: list[int] = []
    while generation:
        order.extend(generation)
        following = []
        for u in generation:
            for w in succ[u]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    following.append(w)
        generation = following
    if len(order) < n:
        return None
    dist = [0.0] * n
    back = list(range(n))
    via = [-1] * n
    for v in order:
        best, source, by = 0.0, v, -1
        for u, weight, edge in pred[v]:
            candidate = dist[u] + weight
            if source == v or candidate > best:
                best, source, by = candidate, u, edge
        dist[v], back[v], via[v] = best, source, by
    end = max(order, key=lambda node: dist[node])
    return _walk_back(end, back, via, dist[end])
