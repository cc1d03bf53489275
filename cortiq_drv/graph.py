"""The graph contract of the reference's `crate::gpu` as `cuda_hybrid.rs` consumes it.

A model is handed to an arm as a stack of `GraphLayer`s (norm weights, a token mixer
`GraphAttn.Full` / `GraphAttn.Gdn`, a `GraphFfn.Dense`) whose matrices are `GraphW`s: a tensor of
the CMF by index and name with its graph kind (4 raw f32 with the data, 6 q4tp, 7 q8_2f), plus the
head geometry, RoPE inverse frequencies, score scale, eps and norm style (`gemma`: x_hat * (1 + w)
for the layer, final, q/k and MTP norms; the GDN output norm is plain w). Norm weights are carried
as stored; the style flag says how they apply. `build(cmf)` assembles it from an opened CMF
deciding each layer's operators by which tensors exist; `HybridGraph.bind(seq)` fills a host
sequence's K/V rows and GDN states in (`cpu_k`, `cpu_v`, `cpu_base`, `cpu_state`), what the CUDA
arm's `admit` seeds its mirrors and states from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .cmf import layout
from .errors import CmfError

KIND_F32, KIND_Q4TP, KIND_Q8_2F = 4, 6, 7
_KIND = {layout.Q4TP: KIND_Q4TP, layout.Q8_2F: KIND_Q8_2F}
_EMPTY = np.zeros(0, dtype=np.float32)


def rope_inv_freq(theta: float, rd: int) -> np.ndarray:
    """inv_freq[j] = theta^(-2j/rd) for the rd/2 rotary pairs, computed in float64, stored float32."""
    j = np.arange(rd // 2, dtype=np.float64)
    return (theta ** (-2.0 * j / rd)).astype(np.float32)  # [rd/2]


@dataclass(frozen=True, eq=False)
class GraphW:
    """A graph weight: CMF tensor `idx` / `name`, `kind` 4 / 6 / 7, shape rows x cols. For kind 4
    `data` is the float32 matrix [rows, cols]: a view of the file for an f32 payload; f16 / bf16
    payloads are handed over as kind 4 too, decoded on each access of `data` (keep the result)."""

    idx: int
    name: str
    kind: int
    rows: int
    cols: int
    load: Callable[[], np.ndarray] | None = field(default=None, repr=False)

    @property
    def data(self) -> np.ndarray | None:
        return None if self.load is None else self.load()


class GraphAttn:
    """The token mixers: `GraphAttn.Full` (gated attention) and `GraphAttn.Gdn` (Gated DeltaNet)."""

    @dataclass(frozen=True, eq=False)
    class Full:
        """Attention with optional q/k norms [hd] and output gate (q_proj rows 2 * nh * hd).
        `cpu_k[g]` / `cpu_v[g]`: the host's rows of KV group g from position `cpu_base`, rows * hd."""

        wq: GraphW
        wk: GraphW
        wv: GraphW
        wo: GraphW
        q_norm: np.ndarray | None
        k_norm: np.ndarray | None
        output_gate: bool
        cpu_k: tuple = ()
        cpu_v: tuple = ()
        cpu_base: int = 0

    @dataclass(frozen=True, eq=False)
    class Gdn:
        """GDN projections, conv taps [cdim * kk] (taps[c][j] at c * kk + j), A_log / dt_bias [nv],
        norm [dv], geometry; `cpu_state` the host's state [ring (kk-1)*cdim | S nv*dk*dv]."""

        qkv: GraphW
        z: GraphW
        a: GraphW
        b: GraphW
        out: GraphW
        conv1d: np.ndarray
        a_log: np.ndarray
        dt_bias: np.ndarray
        norm: np.ndarray
        nv: int
        nk: int
        dk: int
        dv: int
        kk: int
        cpu_state: np.ndarray = field(default_factory=lambda: _EMPTY)


class GraphFfn:
    """The FFNs: `GraphFfn.Dense` (SwiGLU: down(silu(gate x) * up x))."""

    @dataclass(frozen=True, eq=False)
    class Dense:
        gate: GraphW
        up: GraphW
        down: GraphW


@dataclass(frozen=True, eq=False)
class GraphLayer:
    """One decoder layer: input norm, mixer, post-attention norm, FFN (norms [hidden], as stored)."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    attn: GraphAttn.Full | GraphAttn.Gdn
    ffn: GraphFfn.Dense


@dataclass(eq=False)
class SpecTail:
    """A verify window's head: the LM head `lm` over its first `lm_rows` rows after `final_norm`;
    the arm writes the window's logits [rows, lm_rows] into `logits_out`. `pick`: a device argmax
    request (the reference declines it on this path)."""

    lm: GraphW
    lm_rows: int
    final_norm: np.ndarray
    logits_out: np.ndarray | None = None
    pick: object = None


@dataclass(frozen=True)
class _Outcome:
    """completed, declined (the arm refused before any state moved: the caller may fall back), or
    failed (state moved: the sequence must be rebuilt); `reason` says why."""

    status: str
    reason: str = ""

    @classmethod
    def completed(cls):
        return cls("completed")

    @classmethod
    def declined(cls, reason: str):
        return cls("declined", reason)

    @classmethod
    def failed(cls, reason: str):
        return cls("failed", reason)

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class TokenGraphOutcome(_Outcome):
    """Outcome of a one-row token graph (`token`)."""


class BatchGraphOutcome(_Outcome):
    """Outcome of a batch graph (`batch`: a prompt chunk or a verify window)."""


@dataclass(frozen=True, eq=False)
class MtpGraph:
    """The MTP block: eh_proj [hidden, 2 * hidden], its two input norms (embedding, hidden), one
    full-attention decoder layer and its final norm; the LM head and embedding are the trunk's."""

    eh: GraphW
    enorm: np.ndarray
    hnorm: np.ndarray
    layer: GraphLayer
    final_norm: np.ndarray


@dataclass(frozen=True, eq=False)
class HybridGraph:
    """A whole Qwen3.5-family model as the arms are handed it."""

    layers: tuple
    embed: GraphW
    lm: GraphW
    lm_rows: int
    final_norm: np.ndarray
    hidden: int
    nh: int
    nkv: int
    hd: int
    rd: int
    gemma: bool
    eps: float
    scale: float
    theta: float
    invf: np.ndarray
    max_positions: int
    mtp: MtpGraph | None

    def bind(self, seq) -> list:
        """The layers with a host sequence's K/V rows and GDN states filled in."""
        return [_bind(l, seq.kv.get(i), seq.gdn.get(i)) for i, l in enumerate(self.layers)]


def _bind(layer: GraphLayer, kv, gdn) -> GraphLayer:
    # a sealed layer's far field carries no exact rows (the arm takes its device views instead)
    if isinstance(layer.attn, GraphAttn.Full) and hasattr(kv, "cpu_rows"):
        ks, vs, base = kv.cpu_rows()
        return replace(layer, attn=replace(layer.attn, cpu_k=tuple(ks), cpu_v=tuple(vs), cpu_base=base))
    if isinstance(layer.attn, GraphAttn.Gdn) and gdn is not None:
        return replace(layer, attn=replace(layer.attn, cpu_state=gdn.buf))
    return layer


class _Reader:
    """Tensor lookups on an opened CMF that name what is missing or misshapen."""

    def __init__(self, cmf):
        self.cmf = cmf
        self.index = {name: i for i, name in enumerate(cmf.tensors)}

    def has(self, name: str) -> bool:
        return name in self.index

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.index:
            raise CmfError(f"the model has no tensor {name!r}")
        return tuple(int(d) for d in self.cmf.tensors[name].shape)

    def vec(self, name: str, n: int) -> np.ndarray:
        """A small tensor as flat float32 of n values."""
        if int(np.prod(self.shape(name))) != n:
            raise CmfError(f"tensor {name!r} is {self.shape(name)}, {n} values expected")
        return np.ascontiguousarray(self.cmf.array(name), dtype=np.float32).reshape(n)

    def w(self, name: str, rows: int, cols: int) -> GraphW:
        shape = self.shape(name)
        if shape != (rows, cols):
            raise CmfError(f"tensor {name!r} is {shape}, the model wants {(rows, cols)}")
        dtype = layout.dtype_id(self.cmf.tensors[name].dtype)
        if dtype in _KIND:
            return GraphW(self.index[name], name, _KIND[dtype], rows, cols)
        cmf = self.cmf
        load = lambda: np.ascontiguousarray(cmf.array(name), dtype=np.float32).reshape(rows, cols)
        return GraphW(self.index[name], name, KIND_F32, rows, cols, load)


def _full(r: _Reader, p: str, a: dict, hidden: int) -> GraphAttn.Full:
    nh, nkv, hd = a["num_attention_heads"], a["num_kv_heads"], a["head_dim"]
    q_rows = r.shape(p + "q_proj.weight")[0]
    if q_rows not in (nh * hd, 2 * nh * hd):
        raise CmfError(f"{p}q_proj has {q_rows} rows: {nh * hd} or, with the output gate, {2 * nh * hd}")
    norm = lambda n: r.vec(p + n, hd) if r.has(p + n) else None
    return GraphAttn.Full(
        wq=r.w(p + "q_proj.weight", q_rows, hidden), wk=r.w(p + "k_proj.weight", nkv * hd, hidden),
        wv=r.w(p + "v_proj.weight", nkv * hd, hidden), wo=r.w(p + "o_proj.weight", hidden, nh * hd),
        q_norm=norm("q_norm.weight"), k_norm=norm("k_norm.weight"), output_gate=q_rows == 2 * nh * hd)


def _gdn(r: _Reader, p: str, a: dict, hidden: int) -> GraphAttn.Gdn:
    nk, nv, dk, dv, kk = (_need(a, "linear_" + k) for k in (
        "num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim"))
    cdim = 2 * nk * dk + nv * dv
    return GraphAttn.Gdn(
        qkv=r.w(p + "in_proj_qkv.weight", cdim, hidden), z=r.w(p + "in_proj_z.weight", nv * dv, hidden),
        a=r.w(p + "in_proj_a.weight", nv, hidden), b=r.w(p + "in_proj_b.weight", nv, hidden),
        out=r.w(p + "out_proj.weight", hidden, nv * dv), conv1d=r.vec(p + "conv1d.weight", cdim * kk),
        a_log=r.vec(p + "A_log", nv), dt_bias=r.vec(p + "dt_bias", nv), norm=r.vec(p + "norm.weight", dv),
        nv=nv, nk=nk, dk=dk, dv=dv, kk=kk)


def _layer(r: _Reader, p: str, a: dict, hidden: int) -> GraphLayer:
    """The layer under prefix p; its mixer by which tensors exist."""
    if r.has(p + "linear_attn.in_proj_qkv.weight"):
        attn = _gdn(r, p + "linear_attn.", a, hidden)
    elif r.has(p + "self_attn.q_proj.weight"):
        attn = _full(r, p + "self_attn.", a, hidden)
    else:
        raise CmfError(f"layer {p!r}: neither linear_attn.in_proj_qkv nor self_attn.q_proj")
    inter = r.shape(p + "mlp.gate_proj.weight")[0]
    ffn = GraphFfn.Dense(r.w(p + "mlp.gate_proj.weight", inter, hidden),
                         r.w(p + "mlp.up_proj.weight", inter, hidden),
                         r.w(p + "mlp.down_proj.weight", hidden, inter))
    return GraphLayer(r.vec(p + "input_layernorm.weight", hidden),
                      r.vec(p + "post_attention_layernorm.weight", hidden), attn, ffn)


def _mtp(r: _Reader, a: dict, hidden: int) -> MtpGraph | None:
    p = "model.mtp."
    if not r.has(p + "fc.weight"):
        return None
    return MtpGraph(r.w(p + "fc.weight", hidden, 2 * hidden),
                    r.vec(p + "pre_fc_norm_embedding.weight", hidden),
                    r.vec(p + "pre_fc_norm_hidden.weight", hidden),
                    _layer(r, p + "layers.0.", a, hidden), r.vec(p + "norm.weight", hidden))


def _need(a: dict, key: str):
    if key not in a:
        raise CmfError(f"arch header: missing key {key!r}")
    return a[key]


def build(cmf) -> HybridGraph:
    """The graph of an opened CMF holding a Qwen3.5-family model (FORMAT.md names and arch keys)."""
    a = cmf.arch
    r = _Reader(cmf)
    hidden, hd = _need(a, "hidden_size"), _need(a, "head_dim")
    for key in ("num_layers", "num_attention_heads", "num_kv_heads", "rms_norm_eps", "rope_theta"):
        _need(a, key)
    rd = int(round(hd * float(a.get("partial_rotary_factor", 1.0))))
    if rd % 2 or rd > hd:
        raise CmfError(f"rotary width {rd} of head width {hd}: even and at most hd")
    layers = tuple(_layer(r, f"model.layers.{i}.", a, hidden) for i in range(a["num_layers"]))
    vocab = r.shape("model.embed_tokens.weight")[0]
    lm_name = "lm_head.weight" if r.has("lm_head.weight") else "model.embed_tokens.weight"
    theta = float(a["rope_theta"])
    return HybridGraph(
        layers=layers, embed=r.w("model.embed_tokens.weight", vocab, hidden),
        lm=r.w(lm_name, vocab, hidden), lm_rows=vocab, final_norm=r.vec("model.norm.weight", hidden),
        hidden=hidden, nh=a["num_attention_heads"], nkv=a["num_kv_heads"], hd=hd, rd=rd,
        gemma=a.get("norm_style", "qwen") == "gemma", eps=float(a["rms_norm_eps"]),
        scale=float(1.0 / np.sqrt(hd)), theta=theta, invf=rope_inv_freq(theta, rd),
        max_positions=int(a.get("max_position_embeddings") or 0), mtp=_mtp(r, a, hidden))
