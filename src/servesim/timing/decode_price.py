"""The decode half of the analytical timer's pass price, compiled with the replay kernel.

A replay prices every decode pass of every rank (hundreds of thousands of calls on a long
trace), so :class:`DecodePrice` holds what a decode step's price reads as plain numbers and
computes it natively: the same float operations, in the same order, as
:meth:`servesim.timing.analytical.AnalyticalTimer` wrote them, so the prices are the same
floats in both builds. The terms that depend on the batch alone come from the timer
(``batch_terms``), once per batch size.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

BatchTerms = Callable[[float, float], tuple[float, float, float]]


def curve_at(xs: tuple[float, ...], ys: tuple[float, ...], lx: tuple[float, ...],
             x: float) -> float:
    """A piecewise-linear curve of ``log2(x)`` through ``(xs, ys)`` (``lx``: the ``log2``
    of ``xs``), clamped at both ends: ``Curve.__call__`` of the analytical timing."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (math.log2(x) - lx[i - 1]) / (lx[i] - lx[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def _larger(a: float, b: float) -> float:
    """``max(a, b)``: the first of them unless the second is larger."""
    return b if b > a else a


def _smaller(a: float, b: float) -> float:
    """``min(a, b)``: the first of them unless the second is smaller."""
    return b if b < a else a


class DecodePrice:
    """What a decode step of one role costs (see the module docstring)."""

    def __init__(self, geometry: Any, mixers: tuple[int, int, int], kv_scale: float,
                 attn_c: float, lin_c: float, mem: Any, batch_terms: BatchTerms) -> None:
        """``geometry``: the role's StepGeometry; ``mem``: the memory-efficiency Curve."""
        g = geometry
        self.queries: int = g.decode_queries
        self.sparse = bool(g.sparse_topk)
        self.sparse_topk = float(g.sparse_topk) if self.sparse else 0.0
        self.index_flops: float = g.index_flops
        self.index_peak: float = g.index_peak
        self.index_bytes: float = g.index_bytes
        self.heads_local: float = g.heads_local
        self.score_dim: int = g.decode_score_dim
        self.attn_peak: float = g.attn_peak
        self.kv_bytes_layer: float = g.kv_bytes_layer
        self.window: float = float(g.sliding_window) if g.sliding_window else 0.0
        self.linear_flops: float = g.linear_flops_per_token
        self.state_bytes: float = g.state_bytes
        self.mem_bw: float = g.mem_bw
        self.full, self.sliding, self.linear = mixers
        self.kv_scale = kv_scale
        self.attn_c = attn_c
        self.lin_c = lin_c
        self.mem_xs: tuple[float, ...] = tuple(mem.xs)
        self.mem_ys: tuple[float, ...] = tuple(mem.ys)
        self.mem_lx: tuple[float, ...] = tuple(mem._lx)
        self.batch_terms = batch_terms
        self.fixed: dict[int, tuple[float, float, float]] = {}

    def mem_s(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` through memory (the timer's ``_mem_s``)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.mem_bw * curve_at(self.mem_xs, self.mem_ys, self.mem_lx, nbytes))

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float) -> float:
        """The timer's ``decode_ms`` (its KV capacity does not enter the price)."""
        if batch <= 0:
            return 0.0
        n = float(batch)
        # a verification forward computes every draft's position too: q tokens per request
        # through the GEMMs, q queries over a context each request's KV is read for once
        q = self.queries
        tokens = n * q
        terms = self.fixed.get(batch)
        if terms is None:
            terms = self.fixed[batch] = self.batch_terms(n, tokens)
        gemm, comm, fixed = terms
        attn = 0.0
        kv_eff = self.kv_scale
        ctx_total = float(max(active_kv_tokens, 0))
        if self.full:
            # a sparse layer reads each sequence's top-k tokens, picked by its indexer
            # from every cached token
            read = ctx_total
            index = 0.0
            if self.sparse:
                read = n * _smaller(float(mean_context), self.sparse_topk)
                index = _larger(
                    self.index_flops * ctx_total * q / (self.index_peak * self.attn_c),
                    self.mem_s(ctx_total * self.index_bytes) / kv_eff)
            flops = 2.0 * self.heads_local * self.score_dim * read * q
            nbytes = read * self.kv_bytes_layer
            attn += self.full * (_larger(flops / (self.attn_peak * self.attn_c),
                                         self.mem_s(nbytes) / kv_eff) + index)
        if self.sliding:
            w = self.window or float(mean_context)
            ctx = n * _smaller(float(mean_context), w)
            flops = 2.0 * self.heads_local * self.score_dim * ctx * q
            attn += self.sliding * _larger(flops / (self.attn_peak * self.attn_c),
                                           self.mem_s(ctx * self.kv_bytes_layer) / kv_eff)
        if self.linear:
            flops = tokens * self.linear_flops
            attn += self.linear * _larger(flops / (self.attn_peak * self.lin_c),
                                          self.mem_s(2.0 * n * self.state_bytes))
        return (gemm + comm + attn + fixed) * 1e3

    def decode_steps_ms(self, batch: int, active_kv_tokens: int, steps: int) -> list[float]:
        """:meth:`decode_ms` of ``steps`` steady passes: pass ``j`` holds ``batch * j``
        more tokens, mean context their floor mean (``StepTimer.decode_steps_ms``)."""
        out: list[float] = []
        for j in range(steps):
            a = active_kv_tokens + batch * j
            out.append(self.decode_ms(batch, a, a // batch if batch > 0 else 0))
        return out
