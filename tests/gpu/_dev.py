"""Helpers shared by the device tests (import as `import _dev`): a test's device buffers, the
kernel tests' relative RMS, and generated models on both arms (host model and card)."""

from __future__ import annotations

import numpy as np

from cortiq_drv.cmf import CmfFile, CmfWriter
from cortiq_drv.cu import Buf
from cortiq_drv.default_model import Shape, header, tensor_payloads
from cortiq_drv.graph import GraphAttn, SpecTail
from cortiq_drv.host.model import HostModel
from cortiq_drv.hybrid import api
from cortiq_drv.hybrid import state as hstate

# a mid-size model: 8 layers, hidden 1024, head widths 256 / 128
MID = Shape(hidden=1024, layers=8, heads=8, kv_heads=2, head_dim=256, gdn_k_heads=4, gdn_v_heads=8,
            gdn_head_dim=128, ffn=3072, vocab=16384, seed=3)
CAP = 262_144


def rel_rms(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    return float(np.sqrt(np.mean((a - b) ** 2) / max(np.mean(b ** 2), 1e-300)))


class Dev:
    """A test's device buffers, freed by `close` (the `dev` fixture's end)."""

    def __init__(self, ctx):
        self.ctx, self.bufs = ctx, []

    def put(self, a):
        b = Buf.from_array(self.ctx, np.ascontiguousarray(a))
        self.bufs.append(b)
        return b

    def new(self, nbytes, fill=0):
        b = Buf.new(self.ctx, nbytes)
        b.memset(fill)
        self.bufs.append(b)
        return b

    def close(self):
        for b in self.bufs:
            b.close()


def write_model(shape: Shape, path):
    """The generated model (random q4tp weights) without a vocab section."""
    with CmfWriter(path) as w:
        for name, dtype, tshape, payload in tensor_payloads(shape):
            w.add(name, dtype, tshape, payload)
        w.set_header(header(shape, "test"))
    return path


class Arm:
    """A model on both arms: the host model for reference, the card through `api`."""

    def __init__(self, path):
        self.cmf = CmfFile.open(path)
        self.hm = HostModel(self.cmf)
        self.g = g = self.hm.graph
        self.hs = hstate.current()
        self.geo = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=CAP, gemma=g.gemma,
                        eps=g.eps, attn_scale=g.scale)

    def prefill(self, kv_id, ids, chunk):
        """The prompt on the card in chunks; the residual rows of the last chunk."""
        g, pos = self.g, 0
        for c0 in range(0, len(ids), chunk):
            part = ids[c0:c0 + chunk]
            h = np.array(self.hm.embed(part), dtype=np.float32)
            last = c0 + len(part) == len(ids)
            out = api.batch(self.hs, self.cmf, kv_id, 0, g.layers, g.invf, h,
                            positions=range(pos, pos + len(part)), defer=not last, **self.geo)
            assert out.ok, out.reason
            pos += len(part)
        return h

    def token(self, kv_id, tok, pos, layers=None):
        g = self.g
        h = np.array(self.hm.embed([tok])[0], dtype=np.float32)
        logits = np.empty(g.lm_rows, np.float32)
        out = api.token(self.hs, self.cmf, kv_id, layers or g.layers, g.invf, h, position=pos,
                        lm_head=(g.lm, g.lm_rows), final_norm=g.final_norm, logits=logits, **self.geo)
        assert out.ok, out.reason
        return logits

    def window(self, kv_id, toks, pos0, argmax=False):
        g = self.g
        h = np.array(self.hm.embed(toks), dtype=np.float32)
        sp = SpecTail(g.lm, g.lm_rows, g.final_norm)
        ids = np.empty(len(toks), np.int32) if argmax else None
        out = api.batch(self.hs, self.cmf, kv_id, 0, g.layers, g.invf, h, positions=range(pos0, pos0 + len(toks)),
                        spec=sp, argmax_out=ids, **self.geo)
        assert out.ok, out.reason
        return ids if argmax else sp.logits_out

    def gdn_layers(self):
        return sum(isinstance(l.attn, GraphAttn.Gdn) for l in self.g.layers)
