"""An independent float64 reference of docs/MODEL.md's Qwen3.5 hybrid, written from the math for the
host-arm tests (it never calls cortiq_drv.host). Loops over heads and rows, written for clarity.
"""

from __future__ import annotations

import math

import numpy as np


def rel_rms(a, b):
    """Relative RMS error of a against the reference b (a NaN or inf fails)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    err = np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30)
    assert np.isfinite(err)
    return err


def rms(x, w, eps, gemma):
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope(x, pos, theta, rd):
    """x [H, hd] of one row at position pos: split-half rotary on the first rd dims."""
    y = np.array(x, dtype=np.float64)
    half = rd // 2
    for j in range(half):
        ang = pos * theta ** (-2.0 * j / rd)
        c, s = math.cos(ang), math.sin(ang)
        a, b = x[:, j].copy(), x[:, j + half].copy()
        y[:, j] = a * c - b * s
        y[:, j + half] = b * c + a * s
    return y


def mm(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def gdn(x, W, nk, nv, dk, dv, kk, eps, state=None):
    """Rows x [T, hidden] (already normed); W by HF names. Returns (y [T, hidden], (ring, S))."""
    cdim = 2 * nk * dk + nv * dv
    taps = np.asarray(W["conv1d"], np.float64).reshape(cdim, kk)
    raw = mm(x, W["in_proj_qkv"])
    z = mm(x, W["in_proj_z"])
    a = mm(x, W["in_proj_a"])
    b = mm(x, W["in_proj_b"])
    if state is None:
        hist = [np.zeros(cdim) for _ in range(kk - 1)]
        S = np.zeros((nv, dk, dv))
    else:
        hist = [r.copy() for r in state[0]]
        S = state[1].copy()
    a_log = np.asarray(W["A_log"], np.float64)
    dtb = np.asarray(W["dt_bias"], np.float64)
    out = []
    for t in range(x.shape[0]):
        window = hist + [raw[t]]
        conv = np.zeros(cdim)
        for j in range(kk):
            conv += taps[:, j] * window[j]
        hist = window[1:]
        conv = conv * sig(conv)
        q = conv[:nk * dk].reshape(nk, dk)
        k = conv[nk * dk:2 * nk * dk].reshape(nk, dk)
        v = conv[2 * nk * dk:].reshape(nv, dv)
        o = np.zeros((nv, dv))
        for h in range(nv):
            kh = h // (nv // nk)
            qh = q[kh] / math.sqrt(np.sum(q[kh] ** 2) + 1e-6) / math.sqrt(dk)
            khv = k[kh] / math.sqrt(np.sum(k[kh] ** 2) + 1e-6)
            beta = sig(b[t, h])
            sp = math.log1p(math.exp(a[t, h] + dtb[h]))
            decay = math.exp(-math.exp(a_log[h]) * sp)
            S[h] = decay * S[h]
            kvv = khv @ S[h]
            delta = (v[h] - kvv) * beta
            S[h] = S[h] + np.outer(khv, delta)
            o[h] = qh @ S[h]
        zh = z[t].reshape(nv, dv)
        y = rms(o, W["norm"], eps, False) * (zh * sig(zh))
        out.append(y.reshape(-1))
    return mm(np.array(out), W["out_proj"]), (hist, S)


def attention(x, W, positions, kv, *, nh, nkv, hd, rd, theta, eps, gemma):
    """Gated attention of rows x [T, hidden] at `positions`; kv = (list of K rows, list of V rows)
    [nkv, hd] each, extended in place. W: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm."""
    qr = mm(x, W["q_proj"])
    gated = qr.shape[1] == 2 * nh * hd
    kp = mm(x, W["k_proj"])
    vp = mm(x, W["v_proj"])
    outs = []
    for t, pos in enumerate(positions):
        per = qr[t].reshape(nh, -1)
        q = per[:, :hd]
        k = kp[t].reshape(nkv, hd)
        if "q_norm" in W:
            q = rms(q, W["q_norm"], eps, gemma)
        if "k_norm" in W:
            k = rms(k, W["k_norm"], eps, gemma)
        q = rope(q, pos, theta, rd)
        k = rope(k, pos, theta, rd)
        kv[0].append(k)
        kv[1].append(vp[t].reshape(nkv, hd))
        K = np.array(kv[0][:pos + 1])  # [n, nkv, hd]
        V = np.array(kv[1][:pos + 1])
        o = np.zeros((nh, hd))
        for h in range(nh):
            g = h // (nh // nkv)
            s = K[:, g, :] @ q[h] / math.sqrt(hd)
            p = np.exp(s - s.max())
            o[h] = (p / p.sum()) @ V[:, g, :]
            if gated:
                o[h] = o[h] * sig(per[h, hd:])
        outs.append(o.reshape(-1))
    return mm(np.array(outs), W["o_proj"])


def ffn(x, W):
    g = mm(x, W["gate_proj"])
    return mm(g * sig(g) * mm(x, W["up_proj"]), W["down_proj"])


class Model64:
    """The whole hybrid in float64 from decoded weights `get(name)` and the arch dict."""

    def __init__(self, get, arch):
        self.get = get
        self.a = arch
        self.gemma = arch["norm_style"] == "gemma"
        self.eps = arch["rms_norm_eps"]
        self.kinds = arch["layer_types"]
        self.kv = {i: ([], []) for i, k in enumerate(self.kinds) if k == "FullAttention"}
        self.gdn = {i: None for i, k in enumerate(self.kinds) if k == "LinearAttention"}
        self.mtp_kv = ([], [])
        self.pos = 0

    def _attn_kw(self):
        a = self.a
        rd = int(a["head_dim"] * a["partial_rotary_factor"])
        return dict(nh=a["num_attention_heads"], nkv=a["num_kv_heads"], hd=a["head_dim"], rd=rd,
                    theta=a["rope_theta"], eps=self.eps, gemma=self.gemma)

    def _w(self, prefix, names):
        return {n: self.get(f"{prefix}{n}.weight") for n in names}

    def layer(self, h, p, positions, kv=None, gdn_key=None):
        """One decoder layer under prefix p on the residual rows h."""
        a = self.a
        xn = rms(h, self.get(p + "input_layernorm.weight"), self.eps, self.gemma)
        if gdn_key is not None:
            W = self._w(p + "linear_attn.", ["in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
                                             "out_proj", "norm", "conv1d"])
            W["A_log"] = self.get(p + "linear_attn.A_log")
            W["dt_bias"] = self.get(p + "linear_attn.dt_bias")
            y, st = gdn(xn, W, a["linear_num_key_heads"], a["linear_num_value_heads"],
                        a["linear_key_head_dim"], a["linear_value_head_dim"],
                        a["linear_conv_kernel_dim"], self.eps, self.gdn[gdn_key])
            self.gdn[gdn_key] = st
        else:
            W = self._w(p + "self_attn.", ["q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"])
            y = attention(xn, W, positions, kv, **self._attn_kw())
        h = h + y
        xn = rms(h, self.get(p + "post_attention_layernorm.weight"), self.eps, self.gemma)
        return h + ffn(xn, self._w(p + "mlp.", ["gate_proj", "up_proj", "down_proj"]))

    def forward(self, ids):
        """Rows ids at the next positions: (logits [T, vocab], residual hidden [T, hidden])."""
        positions = list(range(self.pos, self.pos + len(ids)))
        h = np.asarray(self.get("model.embed_tokens.weight"), np.float64)[ids]
        for i, kind in enumerate(self.kinds):
            p = f"model.layers.{i}."
            if kind == "LinearAttention":
                h = self.layer(h, p, positions, gdn_key=i)
            else:
                h = self.layer(h, p, positions, kv=self.kv[i])
        self.pos += len(ids)
        return self.head(h, "model.norm.weight"), h

    def head(self, h, norm):
        return mm(rms(h, self.get(norm), self.eps, self.gemma), self.get("lm_head.weight"))

    def mtp_draft(self, h0, t0, position, k):
        """k greedy drafts of the MTP block: rows at position.., its K/V rows zero before."""
        emb = np.asarray(self.get("model.embed_tokens.weight"), np.float64)
        while len(self.mtp_kv[0]) < position:
            z = np.zeros((self.a["num_kv_heads"], self.a["head_dim"]))
            self.mtp_kv[0].append(z)
            self.mtp_kv[1].append(z)
        del self.mtp_kv[0][position:], self.mtp_kv[1][position:]
        h, t, out = np.asarray(h0, np.float64)[None], t0, []
        for j in range(k):
            e = rms(emb[t][None], self.get("model.mtp.pre_fc_norm_embedding.weight"), self.eps, self.gemma)
            hn = rms(h, self.get("model.mtp.pre_fc_norm_hidden.weight"), self.eps, self.gemma)
            x = mm(np.concatenate([e, hn], axis=1), self.get("model.mtp.fc.weight"))
            h = self.layer(x, "model.mtp.layers.0.", [position + j], kv=self.mtp_kv)
            t = int(np.argmax(self.head(h, "model.mtp.norm.weight")[0]))
            out.append(t)
        return out
