"""Every environment knob of the project, typed, read once (the only reader of `os.environ`).

The CMF_* names and defaults are the reference's (`cuda_hybrid.rs`, `cuda_h3.rs`); the
CORTIQ_DRV_* names are this port's own (cache locations). `get()` reads the environment the first
time it is called, never at import; `reset()` makes the next `get()` read it again (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _int(env, name: str, default: int | None) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        return default


def _ints(env, name: str) -> tuple[int, ...] | None:
    """A comma-separated list of integers; None when unset or malformed."""
    v = env.get(name)
    try:
        return tuple(int(x) for x in v.split(",")) if v else None
    except ValueError:
        return None


def _flag(env, name: str, default: bool) -> bool:
    """`NAME=1` on, `NAME=0` off, anything else the default (as the reference's `== Ok("1")`)."""
    v = env.get(name)
    if v == "1":
        return True
    if v == "0":
        return False
    return default


@dataclass(frozen=True)
class Knobs:
    # Small-path graphs (`CMF_CUDA_GRAPH=0` launches directly).
    cuda_graph: bool
    # Kernels that start with pdl_begin() launched as programmatic dependents (`CORTIQ_DRV_PDL=0`:
    # plain launches; this port's own, the reference has no such launches).
    cuda_pdl: bool
    # Stage times on stderr, each stage closed by a stream sync (`CMF_CUDA_PROF=1`).
    cuda_prof: bool
    # Graph counters and declines on stderr (`CMF_CUDA_DEBUG=1`).
    cuda_debug: bool
    # What the card holds, on stderr (`CMF_CUDA_MEM=1`).
    cuda_mem: bool
    # Ceiling in bytes on the process's footprint on the card (`CMF_GPU_VRAM_MB`), None: free memory.
    vram_bytes: int | None
    # The plan arena: one allocation for a plan's matrices (`CMF_HYB_ARENA=0` turns it off).
    hyb_arena: bool
    # Attention scratch sized for the K/V capacity rather than the keys seen (`CMF_HYB_KCAP=1`).
    hyb_kcap: bool
    # Kernel times of the N-th decode token, launched one by one (`CMF_HYB_KT=N`).
    hyb_kt: int | None
    # Prompt-path weight expansion band in bytes (`CMF_HYB_WD_MB`, default 256 MiB; the reference's
    # 64 cuts the 9B layers into more, smaller GEMMs: on the H200 at 4096 tokens 256 gave 713 against
    # 671 TFLOP/s and 26.0k against 25.2k tok/s, same run; a tight budget shrinks the band anyway).
    hyb_wd_bytes: int
    # Query rows one attention GEMM pass takes at most (`CMF_HYB_ATT_ROWS`, >= 16, default 128).
    hyb_att_rows: int
    # Prompt-path attention in one kernel (hy_flash_h) where the geometry allows
    # (`CORTIQ_DRV_FLASH=0`: the score GEMM passes; this port's own, the reference has no such kernel).
    hyb_flash: bool
    # Seal attention layers once a prompt reaches this many rows (`CMF_O1_SEAL_AT`; None: never).
    o1_seal_at: int | None
    # The attention layers a seal takes (`CMF_O1_LAYERS=3,7`; None: every attention layer).
    o1_layers: tuple[int, ...] | None
    # Far-field landmarks, window and sinks (`CMF_O1_M`, `CMF_O1_W`, `CMF_O1_SINK`: 32, 128, 4).
    o1_m: int
    o1_w: int
    o1_sink: int
    # Rectified far weights u = max(u, 0) (`CMF_O1_RECT=1`).
    o1_rect: bool
    # Kernel compile cache directory (`CORTIQ_DRV_KERNEL_CACHE`).
    kernel_cache: Path
    # User cache: the embedded default model, derived tokenizer (`CORTIQ_DRV_CACHE`).
    cache_dir: Path
    # Host arm: bytes of decoded float32 weights it keeps (`CORTIQ_DRV_HOST_WEIGHT_MB`, 4096).
    host_weight_bytes: int
    # CUDA installs the cuBLAS loader searches (`CUDA_HOME`, then `CUDA_PATH`, when set).
    cuda_homes: tuple[Path, ...]


def _cache_root(env) -> Path:
    explicit = env.get("CORTIQ_DRV_CACHE")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "cortiq_drv"


def _read(env) -> Knobs:
    cache = _cache_root(env)
    att = _int(env, "CMF_HYB_ATT_ROWS", 128)
    vram = _int(env, "CMF_GPU_VRAM_MB", None)
    kc = env.get("CORTIQ_DRV_KERNEL_CACHE")
    return Knobs(
        cuda_graph=_flag(env, "CMF_CUDA_GRAPH", True),
        cuda_pdl=_flag(env, "CORTIQ_DRV_PDL", True),
        cuda_prof=_flag(env, "CMF_CUDA_PROF", False),
        cuda_debug=_flag(env, "CMF_CUDA_DEBUG", False),
        cuda_mem=_flag(env, "CMF_CUDA_MEM", False),
        vram_bytes=None if vram is None else vram << 20,
        hyb_arena=_flag(env, "CMF_HYB_ARENA", True),
        hyb_kcap=_flag(env, "CMF_HYB_KCAP", False),
        hyb_kt=_int(env, "CMF_HYB_KT", None),
        hyb_wd_bytes=(_int(env, "CMF_HYB_WD_MB", 256) or 256) << 20,
        hyb_att_rows=att if att is not None and att >= 16 else 128,
        hyb_flash=_flag(env, "CORTIQ_DRV_FLASH", True),
        o1_seal_at=_int(env, "CMF_O1_SEAL_AT", None),
        o1_layers=_ints(env, "CMF_O1_LAYERS"),
        o1_m=_int(env, "CMF_O1_M", 32) or 32,
        o1_w=_int(env, "CMF_O1_W", 128) or 128,
        o1_sink=max(_int(env, "CMF_O1_SINK", 4) or 0, 0),
        o1_rect=_flag(env, "CMF_O1_RECT", False),
        kernel_cache=Path(kc) if kc else cache / "kernels",
        cache_dir=cache,
        host_weight_bytes=max(_int(env, "CORTIQ_DRV_HOST_WEIGHT_MB", 4096) or 0, 1) << 20,
        cuda_homes=tuple(Path(env[k]) for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)),
    )


_KNOBS: Knobs | None = None


def get() -> Knobs:
    """The knobs, read from the environment on the first call."""
    global _KNOBS
    if _KNOBS is None:
        _KNOBS = _read(os.environ)
    return _KNOBS


def reset() -> None:
    """Forget the knobs read so far: the next `get()` reads the environment again."""
    global _KNOBS
    _KNOBS = None
