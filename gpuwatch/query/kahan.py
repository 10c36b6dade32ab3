"""Kahan-Neumaier summation on numpy arrays, the way Prometheus's kahansum.Inc adds floats."""

from __future__ import annotations

import numpy as np


def kahan_inc(inc: np.ndarray, total: np.ndarray, comp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Add `inc` to `total` with compensation `comp`; return the new (total, comp)."""
    with np.errstate(invalid="ignore", over="ignore"):
        t = total + inc
        big = np.abs(total) >= np.abs(inc)
        c = comp + np.where(big, (total - t) + inc, (inc - t) + total)
        c = np.where(np.isinf(t), 0.0, c)
    return t, c


def kahan_rows(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum each column of `values` (rows in order, where `mask`); return (sum, compensation)."""
    n = values.shape[1]
    total = np.zeros(n)
    comp = np.zeros(n)
    for i in range(values.shape[0]):
        t, c = kahan_inc(values[i], total, comp)
        m = mask[i]
        total = np.where(m, t, total)
        comp = np.where(m, c, comp)
    return total, comp


def kahan_result(total: np.ndarray, comp: np.ndarray) -> np.ndarray:
    """Return total + comp, except where total is infinite."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(total), total, total + comp)


def mean_rows(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average each column over the masked rows as Prometheus's avg does (Kahan, incremental on overflow)."""
    k, n = values.shape
    total = np.zeros(n)
    comp = np.zeros(n)
    mean = np.zeros(n)
    count = np.zeros(n)
    incremental = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for i in range(k):
            m = mask[i]
            x = values[i]
            first = m & (count == 0)
            count = count + m
            total = np.where(first, x, total)
            rest = m & ~first
            if not rest.any():
                continue
            t, c = kahan_inc(x, total, comp)
            direct_ok = rest & ~incremental & ~np.isinf(t)
            total = np.where(direct_ok, t, total)
            comp = np.where(direct_ok, c, comp)
            switch = rest & ~incremental & np.isinf(t)
            if switch.any():
                mean = np.where(switch, total / (count - 1), mean)
                comp = np.where(switch, comp / (count - 1), comp)
                incremental = incremental | switch
            inc_rows = rest & incremental
            if inc_rows.any():
                q = (count - 1) / count
                mt, mc = kahan_inc(x / count, q * mean, q * comp)
                mean = np.where(inc_rows, mt, mean)
                comp = np.where(inc_rows, mc, comp)
        direct = total / count + comp / count
        return np.where(incremental, mean + comp, direct)
