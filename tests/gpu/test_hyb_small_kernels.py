"""The small path's GDN and attention kernels on a device, launched as the reference's `launch` /
`spec_restore` launch them, against `hybrid/kernels_ref.py`.

Tolerances: relative RMS <= 1e-5 on float32 outputs (2e-5 for attention over more than 4096 keys:
longer sums), f16 rows within one f16 rounding of the reference's, bits where bits are promised:
a window's rows against one-row steps, a restore against a direct scan of the accepted rows,
planes against put3 of the kernel's own f32, argmax, f16 conversion.
"""

import numpy as np
import pytest

from _dev import rel_rms
from cortiq_drv.cu import kargs
from cortiq_drv.hybrid import kernels_ref as kr

pytestmark = pytest.mark.gpu

F32 = np.float32
ATTN_NBLK = 129


# ---- GDN ------------------------------------------------------------------------------------

def gdn_case(seed, n, nk=2, nv=4, dk=128, dv=128, kk=4, hidden=256):
    rng = np.random.default_rng(seed)
    cdim = 2 * nk * dk + nv * dv
    p = dict(qkv=rng.standard_normal((n, cdim)).astype(F32),
             ring=rng.standard_normal((kk - 1, cdim)).astype(F32),
             taps=(0.5 * rng.standard_normal((cdim, kk))).astype(F32),
             xn=rng.standard_normal((n, hidden)).astype(F32),
             aw=(0.1 * rng.standard_normal((nv, hidden))).astype(F32),
             bw=(0.1 * rng.standard_normal((nv, hidden))).astype(F32),
             a_log=rng.uniform(-1, 1, nv).astype(F32), dt_bias=rng.uniform(-1, 1, nv).astype(F32))
    s0 = (0.1 * rng.standard_normal((nv, dk, dv))).astype(F32)
    return p, s0, dict(nk=nk, nv=nv, dk=dk, dv=dv, kk=kk, hidden=hidden, cdim=cdim, qs=cdim + 64)


def padded(rows, stride):
    out = np.zeros((rows.shape[0], stride), F32)
    out[:, :rows.shape[1]] = rows
    return out


class GdnLayer:
    """One layer's device state and a window's buffers, as `admit` / `book` lay them out."""

    def __init__(self, dev, p, s0, g, nmax=16):
        self.g, self.dev = g, dev
        self.s = dev.put(s0)
        self.ring = dev.put(p["ring"])
        self.taps, self.aw, self.bw = dev.put(p["taps"]), dev.put(p["aw"]), dev.put(p["bw"])
        self.a_log, self.dt_bias = dev.put(p["a_log"]), dev.put(p["dt_bias"])
        self.qkv = dev.new(nmax * g["qs"] * 4)
        self.xn = dev.new(nmax * g["hidden"] * 4)
        self.cq = dev.new(nmax * g["cdim"] * 4)
        self.gb = dev.new(nmax * 2 * g["nv"] * 4)
        self.o = dev.new(nmax * g["nv"] * g["dv"] * 4)
        self.s_save = dev.new(s0.nbytes)
        self.ring_save = dev.put(p["ring"])

    def rows(self, qkv, xn):
        self.qkv.upload(padded(qkv, self.g["qs"]))
        self.xn.upload(xn)

    def front(self, kern, ctx, n, tape=None):
        """The front; `tape` (tq, rs): a verify window's raw-row and ring saves."""
        g = self.g
        tq, rs = tape or (None, None)
        ctx.launch(kern("hy_gdn_front"), (g["cdim"] // g["dk"] + 2 * g["nv"], n), max(g["dk"], 64), 0,
                   kargs("QiQQQiiiiiQiQQQQQiQQ", self.qkv, g["qs"], self.ring, self.taps, self.cq, n, g["cdim"],
                         g["kk"], g["nk"], g["dk"], self.xn, g["hidden"], self.aw, self.bw, self.a_log,
                         self.dt_bias, self.gb, g["nv"], tq, rs))

    def scan(self, kern, ctx, n, col, save=None):
        g = self.g
        ring = self.ring if g["kk"] > 1 else None
        if col:
            rb = -(-g["cdim"] // 128) if g["kk"] > 1 else 0
            ctx.launch(kern("hy_gdn_scan4"), (g["nv"] * g["dv"] // 32 + rb, 1), 128, 0,
                       kargs("QQQQiiiiiQQiiQ", self.cq, self.gb, self.s, self.o, n, g["cdim"], g["nv"], g["nk"],
                             g["dv"], ring, self.qkv, g["qs"], g["kk"], save))
        else:
            rb = -(-g["cdim"] // 256) if g["kk"] > 1 else 0
            ctx.launch(kern("hy_gdn_scan"), (-(-g["nv"] * g["dv"] // 8) + rb, 1), 256, 0,
                       kargs("QQQQiiiiiiQQii", self.cq, self.gb, self.s, self.o, n, g["cdim"], g["nv"], g["nk"],
                             g["dk"], g["dv"], ring, self.qkv, g["qs"], g["kk"]))

    def read(self, n):
        g = self.g
        return dict(cq=self.cq.to_host(F32)[:n * g["cdim"]].reshape(n, -1),
                    gb=self.gb.to_host(F32)[:n * 2 * g["nv"]].reshape(n, -1),
                    o=self.o.to_host(F32)[:n * g["nv"] * g["dv"]].reshape(n, -1),
                    s=self.s.to_host(F32), ring=self.ring.to_host(F32))


@pytest.mark.parametrize("n,kk", [(1, 4), (5, 4), (16, 4), (3, 1)])
def test_gdn_front(ctx, kern, dev, n, kk):
    p, s0, g = gdn_case(n + 10 * kk, n, kk=kk)
    lay = GdnLayer(dev, p, s0, g)
    lay.rows(p["qkv"], p["xn"])
    lay.front(kern, ctx, n)
    got = lay.read(n)
    cq, gb = kr.gdn_front(**p, nk=g["nk"], dk=g["dk"])
    assert rel_rms(got["cq"], cq) < 1e-5
    assert rel_rms(got["gb"], gb) < 1e-5
    # the front reads the ring, the scan moves it
    np.testing.assert_array_equal(got["ring"], p["ring"].reshape(-1))


@pytest.mark.parametrize("n,kk", [(1, 4), (5, 4), (16, 4), (3, 1)])
def test_gdn_front_keeps_the_tape(ctx, kern, dev, n, kk):
    """With a tape the front also saves the window's raw rows (first cdim columns, qs apart) and
    the ring as it found it, and computes the same bytes as without."""
    p, s0, g = gdn_case(77 + n + kk, n, kk=kk)
    lay = GdnLayer(dev, p, s0, g)
    lay.rows(p["qkv"], p["xn"])
    lay.front(kern, ctx, n)
    plain = lay.read(n)
    tq = dev.put(np.full((16, g["qs"]), -7.0, F32))
    rs = dev.put(np.full((max(kk - 1, 1), g["cdim"]), -7.0, F32))
    lay.front(kern, ctx, n, (tq, rs if kk > 1 else None))
    got = lay.read(n)
    for k in ("cq", "gb"):
        assert got[k].tobytes() == plain[k].tobytes(), k
    saved = tq.to_host(F32).reshape(16, g["qs"])
    assert saved[:n, :g["cdim"]].tobytes() == p["qkv"].tobytes()
    assert (saved[n:] == -7.0).all() and (saved[:n, g["cdim"]:] == -7.0).all()
    if kk > 1:
        assert rs.to_host(F32).tobytes() == p["ring"].tobytes()
    np.testing.assert_array_equal(got["ring"], p["ring"].reshape(-1))


SCANS = [pytest.param(True, 128, 128, id="scan4"), pytest.param(False, 128, 128, id="scan-dk128"),
         pytest.param(False, 64, 48, id="scan-dk64-dv48")]


@pytest.mark.parametrize("col,dk,dv", SCANS)
@pytest.mark.parametrize("n", [1, 7, 16])
def test_gdn_scan(ctx, kern, dev, col, dk, dv, n):
    p, s0, g = gdn_case(100 + n, n, dk=dk, dv=dv)
    cq, gb = kr.gdn_front(**p, nk=g["nk"], dk=dk)
    lay = GdnLayer(dev, p, s0, g)
    lay.rows(p["qkv"], p["xn"])
    lay.cq.upload(cq)
    lay.gb.upload(gb)
    lay.scan(kern, ctx, n, col, save=lay.s_save if col else None)
    got = lay.read(n)
    o, s = kr.gdn_scan(cq, gb, s0, g["nk"])
    assert rel_rms(got["o"], o) < 1e-5
    assert rel_rms(got["s"], s.reshape(-1)) < 1e-5
    np.testing.assert_array_equal(got["ring"], kr.ring_move(p["ring"], p["qkv"]).reshape(-1))
    if col:
        assert lay.s_save.to_host(F32).tobytes() == s0.tobytes()


@pytest.mark.parametrize("col,dk,dv", SCANS)
def test_gdn_window_rows_equal_one_row_steps(ctx, kern, dev, col, dk, dv):
    n = 16
    p, s0, g = gdn_case(7, n, dk=dk, dv=dv)
    win, step = GdnLayer(dev, p, s0, g), GdnLayer(dev, p, s0, g)
    win.rows(p["qkv"], p["xn"])
    win.front(kern, ctx, n)
    win.scan(kern, ctx, n, col)
    w = win.read(n)
    for i in range(n):
        step.rows(p["qkv"][i:i + 1], p["xn"][i:i + 1])
        step.front(kern, ctx, 1)
        step.scan(kern, ctx, 1, col)
        one = step.read(1)
        for k in ("cq", "gb", "o"):
            assert one[k].tobytes() == w[k][i:i + 1].tobytes(), (k, i)
    assert one["s"].tobytes() == w["s"].tobytes() and one["ring"].tobytes() == w["ring"].tobytes()


def rtab(layers):
    """`spec_restore`'s table: 7 pointers a layer."""
    return np.array([[x.s_save.ptr, x.s.ptr, x.cq.ptr, x.gb.ptr, x.ring_save.ptr, x.ring.ptr, x.qkv.ptr]
                     for x in layers], np.uint64)


@pytest.mark.parametrize("col,dk,dv", SCANS)
@pytest.mark.parametrize("keep", [1, 3, 8])
def test_gdn_restore_equals_direct_scan_of_accepted_rows(ctx, kern, dev, col, dk, dv, keep):
    n, layers, direct = 8, [], []
    for li in range(2):
        p, s0, g = gdn_case(50 + li, n, dk=dk, dv=dv)
        # the verify window with its tape (the host copies S itself for the warp scan)
        lay = GdnLayer(dev, p, s0, g)
        lay.rows(p["qkv"], p["xn"])
        if not col:
            lay.s_save.upload(s0)
        lay.front(kern, ctx, n)
        lay.scan(kern, ctx, n, col, save=lay.s_save if col else None)
        layers.append(lay)
        ref = GdnLayer(dev, p, s0, g)
        ref.rows(p["qkv"][:keep], p["xn"][:keep])
        ref.front(kern, ctx, keep)
        ref.scan(kern, ctx, keep, col)
        direct.append(ref.read(keep))
    tab = dev.put(rtab(layers))
    if col:
        ctx.launch_3d(kern("hy_gdn_restore_scan4"), (g["nv"] * dv // 32, 2, 1), 128, 0,
                      kargs("Qiiiii", tab, keep, g["cdim"], g["nv"], g["nk"], dv))
    else:
        ctx.launch_3d(kern("hy_gdn_restore_scan"), (-(-g["nv"] * dv // 8), 2, 1), 256, 0,
                      kargs("Qiiiiii", tab, keep, g["cdim"], g["nv"], g["nk"], dk, dv))
    ctx.launch_3d(kern("hy_gdn_restore_ring"), (-(-g["cdim"] // 256), 2, 1), 256, 0,
                  kargs("Qiiii", tab, keep, g["qs"], g["cdim"], g["kk"]))
    for lay, want in zip(layers, direct):
        got = lay.read(keep)
        assert got["s"].tobytes() == want["s"].tobytes()
        assert got["ring"].tobytes() == want["ring"].tobytes()


@pytest.mark.parametrize("sig,gemma", [(0, 0), (1, 1)])
def test_gdn_out32(ctx, kern, dev, sig, gemma):
    rng = np.random.default_rng(sig)
    n, nv, dv, eps = 3, 4, 128, 1e-6
    zs, ps = nv * dv + 32, nv * dv + 64
    o, z = rng.standard_normal((n, nv * dv)).astype(F32), rng.standard_normal((n, nv * dv)).astype(F32)
    norm = rng.standard_normal(dv).astype(F32)
    ob, zb, nb = dev.put(o), dev.put(padded(z, zs)), dev.put(norm)
    of = dev.new(o.nbytes)
    planes = [dev.new(n * ps * 2, 0xFF) for _ in range(3)]
    ctx.launch(kern("hy_gdn_out32"), (n * nv, 1), dv, 0,
               kargs("QQiQQiifiiQQQi", ob, zb, zs, nb, of, nv, dv, eps, sig, gemma, *planes, ps))
    y = of.to_host(F32, (n, nv * dv))
    assert rel_rms(y, kr.gdn_out(o, z, norm, nv, eps, bool(sig), bool(gemma))) < 1e-5
    for got, want in zip(planes, kr.put3(y)):
        g = got.to_host(np.uint16, (n, ps))
        np.testing.assert_array_equal(g[:, kr.plane_cols(nv * dv)], want)
        assert (g[:, nv * dv:] == 0xFFFF).all()


@pytest.mark.parametrize("n,kk,dv,tape", [(1, 4, 128, False), (7, 4, 128, True), (16, 4, 128, True),
                                          (3, 1, 128, False), (5, 4, 64, True)])
def test_gdn_scan4_out32_is_scan4_then_out32(ctx, kern, dev, n, kk, dv, tape):
    """The one-launch scan and gated norm: the bytes of hy_gdn_scan4 then hy_gdn_out32 (o, S, the
    ring, the tape's state copy, of, the planes and nothing past their columns)."""
    p, s0, g = gdn_case(300 + n, n, dv=dv, kk=kk)
    cq, gb = kr.gdn_front(**p, nk=g["nk"], dk=128)
    rng = np.random.default_rng(n)
    nv, eps = g["nv"], 1e-6
    zs, ps = nv * dv + 32, nv * dv + 64
    z, norm = rng.standard_normal((n, nv * dv)).astype(F32), rng.standard_normal(dv).astype(F32)
    zb, nb = dev.put(padded(z, zs)), dev.put(norm)
    outs = []
    for fused in (False, True):
        lay = GdnLayer(dev, p, s0, g)
        lay.rows(p["qkv"], p["xn"])
        lay.cq.upload(cq)
        lay.gb.upload(gb)
        of = dev.new(n * nv * dv * 4)
        planes = [dev.new(n * ps * 2, 0xFF) for _ in range(3)]
        save = lay.s_save if tape else None
        if fused:
            rb = -(-g["cdim"] // (4 * dv)) if kk > 1 else 0
            ctx.launch(kern("hy_gdn_scan4_out32"), (nv + rb, 1), 4 * dv, 0,
                       kargs("QQQQiiiiiQQiiQQiQQfiiQQQi", lay.cq, lay.gb, lay.s, lay.o, n, g["cdim"], nv, g["nk"],
                             dv, lay.ring if kk > 1 else None, lay.qkv, g["qs"], kk, save, zb, zs, nb, of, eps, 0,
                             0, *planes, ps))
        else:
            lay.scan(kern, ctx, n, True, save=save)
            ctx.launch(kern("hy_gdn_out32"), (n * nv, 1), dv, 0,
                       kargs("QQiQQiifiiQQQi", lay.o, zb, zs, nb, of, nv, dv, eps, 0, 0, *planes, ps))
        got = lay.read(n)
        got["of"] = of.to_host(F32, (n, nv * dv))
        got["planes"] = b"".join(pl.to_host().tobytes() for pl in planes)
        got["save"] = lay.s_save.to_host(F32) if tape else s0
        outs.append(got)
    two, one = outs
    for k in ("o", "s", "ring", "of", "save"):
        assert one[k].tobytes() == two[k].tobytes(), k
    assert one["planes"] == two["planes"]
    assert one["save"].tobytes() == s0.tobytes()
    o, y, s = kr.gdn_scan_out(cq, gb, s0, g["nk"], z, norm, eps)
    assert rel_rms(one["o"], o) < 1e-5 and rel_rms(one["of"], y) < 1e-5
    assert rel_rms(one["s"], s.reshape(-1)) < 1e-5


# ---- attention -------------------------------------------------------------------------------

def attn_rb(keys):
    return 64 * max(-(-keys // 8192), 1)


def record(n0, n, far=False):
    """A call record as `book` makes it for an exact mirror (one more block for a far part)."""
    keys = n0 + n
    rb = attn_rb(keys)
    ncap = -(-keys // 4096) * 4096
    return np.array([n0, n0, rb, ncap, ncap // rb + int(far), int(far), 0, 0], np.int32)


def planes_value(planes, shape, cols):
    """The f32 a kernel put into the planes' first `cols` columns (hi + mid + lo is exact)."""
    v = sum(kr.bf16_value(p.to_host(np.uint16, shape)).astype(np.float64) for p in planes).astype(F32)
    return v[:, kr.plane_cols(cols)]


class Attn:
    """Scratch, planes and launches of one attention layer's core (`hy_scores` .. `hy_finish`)."""

    def __init__(self, ctx, kern, dev, hpk, hd, nkv, n, rec):
        self.ctx, self.kern, self.dev = ctx, kern, dev
        self.hpk, self.hd, self.nkv, self.n, self.rec = hpk, hd, nkv, n, rec
        nh, ncap, nbcap = nkv * hpk, int(rec[3]), int(rec[4])
        self.nh, self.ps = nh, nh * hd + 32
        self.ci = dev.put(rec)
        self.S = dev.new(n * nh * ncap * 4)
        self.Mx = dev.new(n * nh * nbcap * 4)
        self.P = dev.new(n * nbcap * nh * hd * 4)
        self.E = dev.new(n * nbcap * nh * 4)
        self.planes = [dev.new(n * self.ps * 2, 0xFF) for _ in range(3)]

    def core(self, qg, kp, vp, gate, scale, blocks=None):
        k, n, nkv = self.kern, self.n, self.nkv
        n0, rb, ncap, nbcap = (int(x) for x in self.rec[[0, 2, 3, 4]])
        for r0, nblk in blocks or [(0, ATTN_NBLK)]:
            self.ctx.launch_3d(k("hy_scores", self.hpk, self.hd), (nblk, nkv, n), 256, 0,
                               kargs("QQQQiiifiiiiQ", qg, kp, self.S, self.Mx, n0, r0, nkv, scale, rb, ncap, nbcap,
                                     n, self.ci))
        for r0, nblk in blocks or [(0, ATTN_NBLK)]:
            self.ctx.launch_3d(k("hy_values", self.hpk, self.hd), (nblk, nkv, n), 256, 0,
                               kargs("QQQQQiiiiiiiQ", self.S, self.Mx, vp, self.P, self.E, n0, r0, nkv, rb, ncap,
                                     nbcap, n, self.ci))
        self.ctx.launch(k("hy_finish", self.hpk, self.hd), (self.nh, n), 256, 0,
                        kargs("QQQQQQiiiiiQ", self.P, self.E, gate, *self.planes, self.ps, n0, rb, self.nh, nbcap,
                              self.ci))
        return planes_value(self.planes, (n, self.ps), self.nh * self.hd)


def attn_case(seed, n0, n, hpk, hd, nkv):
    rng = np.random.default_rng(seed)
    nh = hpk * nkv
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    km = rng.standard_normal((n0 + n, nkv, hd)).astype(np.float16)
    vm = rng.standard_normal((n0 + n, nkv, hd)).astype(np.float16)
    gate = rng.standard_normal((n, nh, hd)).astype(F32)
    return qg, km, vm, gate


@pytest.mark.parametrize("keys", [1, 15, 16, 17, 4097, 8193])
def test_attention_key_counts(ctx, kern, dev, keys):
    hpk, hd, nkv, scale = 4, 256, 2, 1 / 16
    qg, km, vm, gate = attn_case(keys, keys - 1, 1, hpk, hd, nkv)
    a = Attn(ctx, kern, dev, hpk, hd, nkv, 1, record(keys - 1, 1))
    got = a.core(dev.put(qg), dev.put(km), dev.put(vm), dev.put(gate) if keys % 2 else None, scale)
    want = kr.attention(qg, km, vm, keys - 1, scale, gate if keys % 2 else None)
    assert rel_rms(got, want) < (2e-5 if keys > 4096 else 1e-5)
    # nothing past the heads' columns of the planes
    assert (a.planes[0].to_host(np.uint16, (1, a.ps))[:, a.nh * hd:] == 0xFFFF).all()


@pytest.mark.parametrize("hpk,hd", [(4, 256), (16, 64), (1, 128)])
def test_attention_window_rows_equal_one_row_steps(ctx, kern, dev, hpk, hd):
    n0, n, nkv, scale = 55, 16, 2, hd ** -0.5
    qg, km, vm, gate = attn_case(hpk, n0, n, hpk, hd, nkv)
    kp, vp = dev.put(km), dev.put(vm)
    win = Attn(ctx, kern, dev, hpk, hd, nkv, n, record(n0, n)).core(dev.put(qg), kp, vp, dev.put(gate), scale)
    assert rel_rms(win, kr.attention(qg, km, vm, n0, scale, gate)) < 1e-5
    for i in range(n):
        one = Attn(ctx, kern, dev, hpk, hd, nkv, 1, record(n0 + i, 1))
        row = one.core(dev.put(qg[i:i + 1]), kp, vp, dev.put(gate[i:i + 1]), scale)
        assert row.tobytes() == win[i:i + 1].tobytes(), i


def test_attention_gives_the_same_bytes_on_any_grid(ctx, kern, dev):
    """A grid of x blocks along the keys walks key blocks r0 + x, r0 + x + grid, ...: 193 keys
    (four blocks of 64) on a block of its own each, one block walking all four, three (block 0
    walks 0 and 3), five (one with none), and grids split at r0 give the same bytes."""
    hpk, hd, nkv, n0, n = 4, 256, 2, 190, 3
    qg, km, vm, _ = attn_case(3, n0, n, hpk, hd, nkv)
    args = (dev.put(qg), dev.put(km), dev.put(vm), None, 0.0625)
    whole = Attn(ctx, kern, dev, hpk, hd, nkv, n, record(n0, n)).core(*args)
    for blocks in ([(0, 1)], [(0, 3)], [(0, 5)], [(b, 1) for b in range(4)], [(2, 2), (0, 2)]):
        got = Attn(ctx, kern, dev, hpk, hd, nkv, n, record(n0, n)).core(*args, blocks=blocks)
        assert got.tobytes() == whole.tobytes(), blocks


def test_attention_far_block_joins_the_sums(ctx, kern, dev):
    hpk, hd, nkv, n0, scale = 2, 128, 2, 99, 0.1
    qg, km, vm, _ = attn_case(11, n0, 1, hpk, hd, nkv)
    rec = record(n0, 1, far=True)
    a = Attn(ctx, kern, dev, hpk, hd, nkv, 1, rec)
    nh, nbcap = a.nh, int(rec[4])
    rng = np.random.default_rng(12)
    s = np.einsum("khd,hd->hk", km.astype(F32)[:, np.arange(nh) // hpk], qg[0]) * F32(scale)  # [nh, keys]
    fm = (s.max(1) + rng.uniform(-1, 1, nh)).astype(F32)
    pf = rng.standard_normal((nh, hd)).astype(F32)
    ef = rng.uniform(0.5, 2, nh).astype(F32)
    mx = np.zeros((nh, nbcap), F32)
    mx[:, -1] = fm
    pp = np.zeros((nbcap, nh, hd), F32)
    pp[-1] = pf
    ee = np.zeros((nbcap, nh), F32)
    ee[-1] = ef
    a.Mx.upload(mx), a.P.upload(pp), a.E.upload(ee)
    got = a.core(dev.put(qg), dev.put(km), dev.put(vm), None, scale)
    m = np.maximum(s.max(1), fm)
    p = np.exp(s - m[:, None])
    want = (np.einsum("hk,khd->hd", p, vm.astype(F32)[:, np.arange(nh) // hpk]) + pf) / (p.sum(1) + ef)[:, None]
    assert rel_rms(got, want.reshape(1, -1)) < 1e-5


QK = [(4, 256, True, True, True), (2, 128, False, True, False), (16, 64, True, False, True),
      (1, 256, False, False, True)]


@pytest.mark.parametrize("hpk,hd,gated,normed,use_ci", QK)
def test_qk(ctx, kern, dev, hpk, hd, gated, normed, use_ci):
    rng = np.random.default_rng(hpk * hd)
    n, nkv, eps, slot = 3, 2, 1e-6, 5
    nh, half = hpk * nkv, hd // 8
    qs, kvs = nh * hd * (2 if gated else 1) + 32, nkv * hd
    q = rng.standard_normal((n, qs)).astype(F32)
    k, v = (rng.standard_normal((n, kvs)).astype(F32) for _ in range(2))
    qn, kn = (rng.standard_normal(hd).astype(F32) for _ in range(2)) if normed else (None, None)
    ang = np.array([0, 9, 4000])[:, None] * 10000.0 ** (-np.arange(half) / half)
    tab = np.stack([np.sin(ang), np.cos(ang)], -1).astype(F32)
    qg_b, gate_b = dev.new(n * nh * hd * 4), dev.new(n * nh * hd * 4)
    q16 = dev.new(n * nh * hd * 2)
    kp, vp = dev.new(12 * kvs * 2, 0xFF), dev.new(12 * kvs * 2, 0xFF)
    ci = dev.put(record(slot, n)) if use_ci else None
    ctx.launch(kern("hy_qk", hpk, hd), (nh + nkv, n), hd, 0,
               kargs("QiQQiQQQQQQQiiifiiiiQQ", dev.put(q), qs, dev.put(k), dev.put(v), kvs,
                     dev.put(qn) if normed else None, dev.put(kn) if normed else None, qg_b, gate_b, kp, vp,
                     dev.put(tab), nh, nkv, half, eps, 1, int(gated), slot if not use_ci else 0, n, ci, q16))
    qg_w, gate_w, k16, v16 = kr.attn_qk(q, k, v, qn, kn, tab, nh, hd, eps, True, gated)
    qg = qg_b.to_host(F32, (n, nh, hd))
    assert rel_rms(qg, qg_w) < 1e-5
    assert q16.to_host(np.uint16).tobytes() == qg.astype(np.float16).tobytes()
    if gated:
        assert gate_b.to_host(F32, (n, nh, hd)).tobytes() == gate_w.tobytes()
    km, vm = kp.to_host(np.uint16, (12, nkv, hd)), vp.to_host(np.uint16, (12, nkv, hd))
    rows = slice(slot, slot + n)
    assert vm[rows].tobytes() == v16.tobytes()
    kd, kw = km[rows].view(np.float16).astype(F32), k16.astype(F32)
    assert (np.abs(kd - kw) <= np.abs(kw) * 2.0 ** -10 + 2.0 ** -24).all()
    others = np.r_[0:slot, slot + n:12]
    assert (km[others] == 0xFFFF).all() and (vm[others] == 0xFFFF).all()


# ---- head helpers ----------------------------------------------------------------------------

@pytest.mark.parametrize("blocks", [1, 7, 64])
def test_argmax(ctx, kern, dev, blocks):
    """Any split of the row gives the same pick; the arrival counts end at zero."""
    rng = np.random.default_rng(1)
    rows, stride = 248320, 248320 + 7
    x = rng.standard_normal((3, stride)).astype(F32)
    x[0, [7, 200000]] = 9.0
    x[1, rng.integers(0, rows, 50)] = np.nan
    x[1, 123456] = 12.0
    x[2] = 0.0
    x[:, rows:] = 99.0  # past `rows`: never read
    out = dev.put(np.full(8, -1, np.int32))
    part, cnt = dev.new(3 * blocks * 8), dev.new(3 * 4)
    xb = dev.put(x)
    for _ in range(2):
        ctx.launch(kern("hy_argmax"), (blocks, 3), 256, 0, kargs("QiiQiQQ", xb, rows, stride, out, 2, part, cnt))
        got = out.to_host(np.int32)
        assert got[2:5].tolist() == kr.argmax(x[:, :rows]).tolist() == [7, 123456, 0]
        assert (got[:2] == -1).all() and (got[5:] == -1).all()
        assert not cnt.to_host(np.int32).any()
    # a row 4 bytes past a 16-byte boundary (three single columns before its groups, the rest after
    # them): the largest value among the singles at either end
    yb = dev.put(np.zeros(48, F32))
    for rows_y, at in ((39, 1), (38, 37)):
        y = np.linspace(-1, 0, 48, dtype=F32)
        y[1 + at] = 5.0
        yb.upload(y)
        ctx.launch(kern("hy_argmax"), (blocks, 1), 256, 0,
                   kargs("QiiQiQQ", yb.ptr + 4, rows_y, rows_y, out, 0, part, cnt))
        assert out.to_host(np.int32)[0] == kr.argmax(y[None, 1:1 + rows_y])[0] == at


def test_copy16_through_pinned_host_memory(ctx, kern, dev):
    """hy_copy16 reads and writes pinned host memory at its host address (a token's rows in and
    out of its graph), whole 16-byte words, nothing past n."""
    from cortiq_drv.cu import Pinned

    n16 = 1000
    host = Pinned(n16 * 16 * 2 + 16)
    try:
        raw = host.array(np.uint8)
        raw[:] = np.random.default_rng(5).integers(0, 256, raw.size, dtype=np.uint8)
        d = dev.new(n16 * 16 + 16, 0xAB)
        ctx.launch(kern("hy_copy16"), (-(-n16 // 256), 1), 256, 0, kargs("QQi", host.ptr, d, n16))
        got = d.to_host()
        assert got[:n16 * 16].tobytes() == raw[:n16 * 16].tobytes() and (got[n16 * 16:] == 0xAB).all()
        tail = raw[2 * n16 * 16:].copy()
        ctx.launch(kern("hy_copy16"), (-(-n16 // 256), 1), 256, 0, kargs("QQi", d, host.ptr + n16 * 16, n16))
        ctx.sync()
        assert raw[n16 * 16:2 * n16 * 16].tobytes() == raw[:n16 * 16].tobytes()
        assert raw[2 * n16 * 16:].tobytes() == tail.tobytes()
    finally:
        host.close()


def test_embed_gather(ctx, kern, dev):
    rng = np.random.default_rng(4)
    rows, hidden = 40, 512
    ntile, gpr = 3, hidden // 32
    tiles = rng.integers(0, 2 ** 32, (ntile, gpr, 32, 2), dtype=np.uint64).astype(np.uint32)
    codes = rng.integers(0, 32, (ntile, gpr, 16)).astype(np.uint8)
    lad = np.stack([rng.uniform(-9, -5, rows), rng.uniform(0, 0.2, rows)], 1).astype(F32)
    toks = np.array([5, 39, 16, 40, -1], np.int32)
    tb, cb, lb, kb = dev.put(tiles), dev.put(codes), dev.put(lad), dev.put(toks)
    out = dev.new(hidden * 4)
    for j, t in enumerate(toks):
        ctx.launch(kern("hy_embed_gather"), (hidden // 256, 1), 256, 0,
                   kargs("QQQiiQiQ", tb, cb, lb, rows, hidden, kb, j, out))
        got = out.to_host(F32)
        if 0 <= t < rows:
            np.testing.assert_allclose(got, kr.embed_gather(tiles, codes, lad, hidden, int(t)), rtol=4e-7)
        else:
            assert not got.any()


def test_to_half(ctx, kern, dev):
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.standard_normal(1000) * np.exp2(rng.integers(-30, 20, 1000)),
                        [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 70000.0, -1e-8, 2.0 ** -24]]).astype(F32)
    dst = dev.new(x.size * 2)
    ctx.launch(kern("hy_to_half"), (-(-x.size // 256), 1), 256, 0, kargs("QQQ", dev.put(x), dst, x.size))
    assert dst.to_host(np.uint16).tobytes() == kr.to_half(x).tobytes()
