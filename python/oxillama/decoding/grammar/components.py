"""Strongly connected components of a rule graph, shared by the lowering
(left recursion) and the productivity check."""

from __future__ import annotations

__all__ = ["strongly_connected"]


def strongly_connected(adj: list[list[int]]) -> list[int]:
    """Strongly connected components (iterative Tarjan): node -> component."""
    n = len(adj)
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    n_comp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            u, i = work.pop()
            if i == 0:
                index[u] = low[u] = counter
                counter += 1
                stack.append(u)
                on[u] = True
            if i < len(adj[u]):
                work.append((u, i + 1))
                v = adj[u][i]
                if index[v] < 0:
                    work.append((v, 0))
                elif on[v]:
                    low[u] = min(low[u], index[v])
                continue
            if low[u] == index[u]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = n_comp
                    if w == u:
                        break
                n_comp += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[u])
    return comp
