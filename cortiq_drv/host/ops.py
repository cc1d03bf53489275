"""The element-wise and per-row operators of docs/MODEL.md, in float32, in the order it writes them.

Every function takes and returns float32 arrays; scalars are made float32 before they touch an
array so numpy 1.x and 2.x promote the same way.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) times w, or (1 + w) in gemma style."""
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    xh = x / np.sqrt(ms + F32(eps))
    return xh * (F32(1) + w if gemma else w)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); exp overflows to inf for very negative x, which gives the right 0."""
    with np.errstate(over="ignore"):
        return F32(1) / (F32(1) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow."""
    return np.logaddexp(F32(0), x)


def l2_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (the GDN's q and k per head)."""
    ss = np.sum(x * x, axis=-1, keepdims=True, dtype=F32)
    return x / np.sqrt(ss + F32(eps))


def rope_tables(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [n, rd/2] of angle = float32(position) * inv_freq (the reference's `rope_rows`)."""
    ang = positions.astype(F32)[:, None] * inv_freq[None, :]  # [n, rd/2]
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Split-half rotary on the first rd = 2 * cos.shape[-1] dims of x [n, heads, d]; the rest pass."""
    half = cos.shape[-1]
    if half == 0:
        return x
    c = cos[:, None, :]  # [n, 1, half]
    s = sin[:, None, :]
    x1 = x[..., :half]
    x2 = x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half:2 * half] = x2 * c + x1 * s
    return out
