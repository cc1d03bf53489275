"""How a prompt chunk fits the card's budget (the reference checks only weights against it; this
is the prompt path's own part): the named scratch `big` takes for a piece of a chunk (`need`),
and, before any state moves, the way the chunk runs within `CMF_GPU_VRAM_MB` (`fit`): as
configured, else with the expansion band, the up-front score sizing, the attention passes (when
attention keeps its scores in memory) and then the rows a piece shrunk in that order, else
Declined naming the bytes. `prepare` allocates the chunk's scratch before anything moves;
`big.run_chunk` then takes the chunk through `big` piece by piece.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cortiq_drv import knobs
from cortiq_drv.cmf.layout import round_up
from cortiq_drv.errors import CortiqError, Declined
from cortiq_drv.hybrid.mats import vram_budget
from cortiq_drv.hybrid.plan import GdnL

WHAT = "hybrid prompt path"
# One attention pass's scores (key rows x query rows x heads x 4 bytes) stay under this...
PASS_CAP = 384 << 20
# ...and the score scratch is sized up front for a whole chunk's pass, up to this.
WHOLE_CAP = 400 << 20
# Rows a chunk of the GDN scan (HB_C of hyb_gdn_chunk.cuh): the rows of a piece stay a multiple of it
# (the scan's chunks then fall where an unsplit chunk's fall) and never go below it.
SCAN_ROWS = 64
# The fewest query rows an attention pass takes (CMF_HYB_ATT_ROWS' floor).
MIN_ATT = 16


@dataclass(frozen=True)
class BigCfg:
    """How `big` runs a chunk: pieces of at most `rows` rows, weights expanded into a buffer of
    at most `wd_bytes` (one 16-row band of the widest weight at least), attention passes of at
    most `att_rows` query rows, the score scratch sized up front for `hint` keys (0: the
    chunk's own); attention by hy_flash_h where the geometry allows when `flash` (`flash()`)."""

    rows: int
    wd_bytes: int
    att_rows: int
    hint: int
    flash: bool = True


def configured(b: int, hint: int) -> BigCfg:
    """The knobs' configuration for a chunk of b rows (`CMF_HYB_WD_MB`, `CMF_HYB_ATT_ROWS`,
    `CORTIQ_DRV_FLASH`)."""
    k = knobs.get()
    return BigCfg(b, max(k.hyb_wd_bytes, 1 << 20), k.hyb_att_rows, hint, k.hyb_flash)


def gdn_stride(g: GdnL) -> int:
    """Columns of a row of a GDN layer's input projections, [qkv | z | a | b] (one GEMM's output,
    `big._Mul.stacked`), rounded to 4 (the glue's 16-byte row loads)."""
    return round_up(g.cdim + g.nv * g.dv + 2 * g.nv, 4)


def attn_stride(a, nkv: int, hd: int) -> int:
    """Columns of a row of an attention layer's q | k | v projections."""
    return a.q.rows + 2 * nkv * hd


def flash(plan, cfg: BigCfg) -> bool:
    """Whether attention runs as hy_flash_h: cfg asks for it, and the head width is a multiple of
    16 up to 256 (its accumulators), at most 8 query heads a KV head (its block)."""
    return cfg.flash and plan.hd % 16 == 0 and plan.hd <= 256 and plan.hpk <= 8


def wmax(plan) -> tuple[int, int]:
    """Elements of the plan's largest weight or stack of weights one GEMM takes (`_Mul.stacked`),
    and the widest row."""
    mats, stacks = [], []
    for l in plan.layers:
        m = l.mix
        mats += [l.gu, l.down, *([m.qkv, m.z, m.out] if isinstance(m, GdnL) else [m.q, m.k, m.v, m.o])]
        if isinstance(m, GdnL):
            stacks.append((m.qkv.rows + m.z.rows + 2 * m.nv) * m.qkv.cols)
        else:
            stacks.append((m.q.rows + m.k.rows + m.v.rows) * m.q.cols)
    elems = max([x.rows * x.cols for x in mats] + stacks, default=0)
    return elems, max((x.cols for x in mats), default=0)


def wd_elems(plan, wd_bytes: int) -> int:
    """Elements of the expansion buffer: the largest weight or stack of weights, at most
    `wd_bytes` (but one 16-row band of the widest weight at least)."""
    elems, cols = wmax(plan)
    return min(elems, max(wd_bytes // 2, 16 * cols))


def att_passes(pos0: int, b: int, col_base: int, nh: int, att_rows: int) -> list[tuple[int, int]]:
    """The attention passes (first row, rows) of a chunk of b rows at pos0: at most `att_rows`
    query rows each, halved (not below 64) while the pass's scores pass PASS_CAP."""
    out, b0 = [], 0
    while b0 < b:
        p0 = pos0 + b0
        bn = min(b - b0, att_rows)
        while bn > 64 and (p0 + bn - col_base) * bn * nh * 4 > PASS_CAP:
            bn = -(-bn // 2)
        out.append((b0, bn))
        b0 += bn
    return out


def score_bytes(pos0: int, b: int, col_base: int, nkv: int, hpk: int, att_rows: int, hint: int) -> tuple[int, int]:
    """Bytes of the score scratch S (f32) and P (f16) `attend` takes over its passes: the largest
    pass, or the whole chunk's pass sized up front for `hint` keys (up to WHOLE_CAP)."""
    nh = nkv * hpk
    whole = min(max(hint, pos0 + b) * min(b, att_rows) * nh * 4, WHOLE_CAP)
    s = p = 0
    for b0, bn in att_passes(pos0, b, col_base, nh, att_rows):
        cells = nkv * (pos0 + b0 + bn - col_base) * bn * hpk
        s, p = max(s, cells * 4, whole), max(p, cells * 2, whole // 2)
    return s, p


def _gdn_need(g: GdnL, b: int) -> dict:
    vd = g.nv * g.dv
    return {"hb_qkv": b * gdn_stride(g) * 4, "hb_cq": b * g.cdim * 4, "hb_o": b * vd * 4, "hb_of": b * vd * 2,
            # the chunked scan's
            "hb_wg": g.nv * b * 4, "hb_ww": g.nv * b * g.dk * 4, "hb_wu": g.nv * b * g.dv * 4,
            "hb_wp": g.nv * b * SCAN_ROWS * 4}


def _attn_need(plan, a, b: int, pos0: int, cfg: BigCfg) -> dict:
    nh, nkv, hd = plan.nh, plan.nkv, plan.hd
    out = {"hb_q": b * attn_stride(a, nkv, hd) * 4, "hb_qgh": b * nh * hd * 2,
           "hb_gate": b * nh * hd * 4, "hb_ao": b * nh * hd * 2}
    if flash(plan, cfg):
        return out
    s, p = score_bytes(pos0, b, 0, nkv, plan.hpk, cfg.att_rows, cfg.hint)
    out.update(hb_qg=b * nh * hd * 4, hb_aog=b * nh * hd * 4, hb_is=b * nh * 4, hb_s=s, hb_p=p)
    return out


def need(plan, b: int, pos0: int, cfg: BigCfg) -> dict:
    """Bytes of each named scratch `big` takes for a piece of b rows at pos0 under cfg (the
    largest over the plan's layers): the one place their sizes are written (`big` takes them by
    name from `chunk_need`'s, which `fit` keeps in `Fit.sizes`)."""
    out = {"hb_h": b * plan.hidden * 4, "hb_xn": b * plan.hidden * 2,
           "hb_wd": wd_elems(plan, cfg.wd_bytes) * 2, "hb_tab": max(b * plan.invf.size * 2 * 4, 4)}
    for pl in plan.layers:
        m = pl.mix
        part = _gdn_need(m, b) if isinstance(m, GdnL) else _attn_need(plan, m, b, pos0, cfg)
        part.update(hb_gu=b * 2 * pl.inter * 4, hb_mh=b * pl.inter * 2)
        for k, v in part.items():
            out[k] = max(out.get(k, 0), v)
    return out


def pieces(b: int, rows: int) -> list[tuple[int, int]]:
    """Rows [0, b) as (start, end) pieces of at most `rows` rows."""
    return [(a, min(a + rows, b)) for a in range(0, b, rows)]


def chunk_need(plan, b: int, pos0: int, cfg: BigCfg) -> dict:
    """`need` over a chunk's pieces: the largest each name takes, rounded as `scr` allocates."""
    out: dict = {}
    for s, e in pieces(b, cfg.rows):
        for k, v in need(plan, e - s, pos0 + s, cfg).items():
            out[k] = max(out.get(k, 0), round_up(max(v, 1), 256))
    return out


def _candidates(plan, b: int, cfg: BigCfg):
    """cfg, then each shrink step in turn: one-band expansion, no up-front score sizing, halved
    attention passes (these two only where attention keeps scores in memory, not `flash`),
    halved pieces (multiples of SCAN_ROWS)."""
    yield cfg
    _, cols = wmax(plan)
    steps = [replace(cfg, wd_bytes=min(cfg.wd_bytes, 16 * cols * 2))]
    if not flash(plan, cfg):
        steps.append(replace(steps[-1], hint=0))
        while steps[-1].att_rows > MIN_ATT:
            steps.append(replace(steps[-1], att_rows=max(steps[-1].att_rows // 2, MIN_ATT)))
    while steps[-1].rows > SCAN_ROWS:
        steps.append(replace(steps[-1], rows=max(round_up(steps[-1].rows // 2, SCAN_ROWS), SCAN_ROWS)))
    for prev, c in zip([cfg, *steps], steps):
        if c != prev:
            yield c


@dataclass(frozen=True)
class Fit:
    """`fit`'s decision: the configuration, its scratch by name, and the scratch to free first
    (held larger than the chunk needs, when keeping it would pass the budget)."""

    cfg: BigCfg
    sizes: dict
    release: tuple


def fit(plan, b: int, pos0: int, cfg: BigCfg, held: dict, fixed: int, budget: int) -> Fit:
    """The first of cfg and its shrink steps whose scratch fits: `fixed` bytes (weights, K/V,
    GDN states, scratch outside the prompt path's) plus the prompt path's scratch afterwards
    (`held`: name -> bytes it holds now; kept where larger unless that passes the budget) within
    `budget`. Declined, naming the bytes, when even the smallest step does not fit."""
    smallest = None
    for c in _candidates(plan, b, cfg):
        sizes = chunk_need(plan, b, pos0, c)
        rest = sum(v for k, v in held.items() if k not in sizes)
        keep = fixed + rest + sum(max(v, held.get(k, 0)) for k, v in sizes.items())
        if keep <= budget:
            return Fit(c, sizes, ())
        if fixed + sum(sizes.values()) <= budget:
            return Fit(c, sizes, tuple(k for k in held if held[k] > sizes.get(k, 0)))
        smallest = (c, sizes)
    c, sizes = smallest
    mb = lambda n: f"{n / (1 << 20):.0f} MiB"
    raise Declined(WHAT, f"a prompt chunk of {b} rows at {pos0} needs {mb(sum(sizes.values()))} of scratch even "
                         f"in pieces of {c.rows} rows (weights, K/V and GDN states and other scratch hold "
                         f"{mb(fixed)}; total {mb(fixed + sum(sizes.values()))}, budget {mb(budget)})")


def plan_chunk(hs, plan, b: int, pos0: int) -> Fit:
    """`fit` for a chunk of b rows at pos0 against what the card holds now (after `admit`, so
    the chunk's K/V room is counted) and the budget (`vram_budget`)."""
    ctx = hs.ctx
    hb = {k: v.bytes for k, v in hs.scratch.items() if k.startswith("hb_")}
    other = sum(v.bytes for k, v in hs.scratch.items() if not k.startswith("hb_"))
    budget = vram_budget(ctx, ctx.kv_bytes + other + sum(hb.values()))
    return fit(plan, b, pos0, configured(b, hs.kv_hint), hb, ctx.resident + ctx.kv_bytes + other, budget)


def prepare(hs, plan, b: int, pos0: int) -> Fit:
    """`plan_chunk`, then the scratch it sizes allocated (what it frees first freed): nothing else
    moves. Declined when the chunk does not fit or the card cannot allocate its scratch."""
    f = plan_chunk(hs, plan, b, pos0)
    hs.scr_release(f.release)
    try:
        for name, nbytes in f.sizes.items():
            hs.scr(name, nbytes)
    except CortiqError as e:
        raise Declined(WHAT, f"the card could not allocate a prompt chunk's scratch ({e})") from e
    return f

