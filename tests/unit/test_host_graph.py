"""The graph contract built from the tiny CMF, a host sequence bound into it, and the host's
weight store under a memory budget (banded products, embedding rows, LRU by bytes)."""

import numpy as np
import pytest

import _tiny
from cortiq_drv.cmf import CmfFile, CmfWriter, layout
from cortiq_drv.errors import CmfError
from cortiq_drv.graph import (BatchGraphOutcome, GraphAttn, GraphFfn, TokenGraphOutcome, build,
                              rope_inv_freq)
from cortiq_drv.host import HostModel
from cortiq_drv.host.weights import WeightCache, decode_rows


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return _tiny.write_tiny(tmp_path_factory.mktemp("g") / "tiny.cmf", seed=2)


def test_graph_layers_kinds_and_constants(path):
    cmf = CmfFile.open(path)
    g = build(cmf)
    names = list(cmf.tensors)
    assert [type(l.attn) for l in g.layers] == [GraphAttn.Gdn] * 3 + [GraphAttn.Full]
    gdn, full = g.layers[0].attn, g.layers[3].attn
    assert (gdn.nk, gdn.nv, gdn.dk, gdn.dv, gdn.kk) == (2, 4, 16, 16, 4)
    # q4tp matrices are kind 6 with no data; the f32 a/b projections kind 4 with their data
    assert gdn.qkv.kind == 6 and gdn.qkv.data is None and (gdn.qkv.rows, gdn.qkv.cols) == (128, 64)
    assert gdn.a.kind == 4 and np.array_equal(gdn.a.data, cmf.array(gdn.a.name))
    assert names[gdn.qkv.idx] == gdn.qkv.name == "model.layers.0.linear_attn.in_proj_qkv.weight"
    assert gdn.conv1d.shape == (128 * 4,)
    assert np.array_equal(gdn.conv1d.reshape(128, 4), cmf.array(gdn.qkv.name[:-len("in_proj_qkv.weight")]
                                                                 + "conv1d.weight")[:, 0, :])
    assert full.output_gate and full.q_norm.shape == (32,) and full.wq.rows == 256
    assert isinstance(g.layers[0].ffn, GraphFfn.Dense) and g.layers[0].ffn.gate.rows == 128
    assert (g.nh, g.nkv, g.hd, g.rd, g.hidden, g.lm_rows) == (4, 2, 32, 8, 64, 512)
    assert g.gemma and g.scale == pytest.approx(32 ** -0.5)
    assert np.array_equal(g.invf, rope_inv_freq(10000.0, 8))
    assert g.lm.name == "lm_head.weight" and g.mtp.eh.cols == 128


def test_bind_hands_over_the_host_state(path):
    m = HostModel.open(path)
    seq = m.new_sequence()
    m.prefill(seq, [3, 4, 5, 6, 7])
    layers = m.graph.bind(seq)
    full = layers[3].attn
    assert len(full.cpu_k) == 2 and full.cpu_base == 0
    # group g's rows, r * hd apart
    assert np.array_equal(full.cpu_k[1].reshape(5, 32), seq.kv[3].k[1, :5])
    assert np.array_equal(full.cpu_v[0].reshape(5, 32), seq.kv[3].v[0, :5])
    gdn = layers[1].attn
    assert gdn.cpu_state.shape == (3 * 128 + 4 * 16 * 16,)
    assert np.shares_memory(gdn.cpu_state, seq.gdn[1].buf)
    assert m.graph.layers[3].attn.cpu_k == ()


def test_outcomes():
    assert TokenGraphOutcome.completed().ok
    d = BatchGraphOutcome.declined("rows past the context cap")
    assert not d.ok and d.status == "declined" and "cap" in d.reason
    assert isinstance(d, BatchGraphOutcome) and TokenGraphOutcome.failed("x").status == "failed"


def test_missing_mixer_is_named(tmp_path):
    p = _tiny.write_tiny(tmp_path / "m.cmf")
    cmf = CmfFile.open(p)
    cmf.header["arch"]["num_layers"] = 5
    with pytest.raises(CmfError, match="model.layers.4."):
        build(cmf)


def test_weights_under_a_budget_stream_and_evict(path):
    cmf = CmfFile.open(path)
    name = "lm_head.weight"  # 512 x 64 q4tp: 128 KiB of float32
    full = cmf.array(name)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    small = WeightCache(cmf, 40_000)
    y = small.matmul(name, x)
    assert small.held_bytes == 0 and small.decodes == 0
    assert np.allclose(y, x @ full.T, rtol=1e-5, atol=1e-5)
    ids = np.array([511, 0, 77, 77])
    assert np.array_equal(small.rows("model.embed_tokens.weight", ids),
                          cmf.array("model.embed_tokens.weight")[ids])
    # room for one 32 KiB FFN matrix: up evicts gate, gate comes back decoded again
    lru = WeightCache(cmf, 50_000)
    for n in ("gate_proj", "up_proj", "gate_proj", "gate_proj"):
        lru.get(f"model.layers.0.mlp.{n}.weight")
    assert lru.decodes == 3 and lru.held_bytes == 32768


def test_budget_does_not_change_the_logits(path):
    ids = [9, 8, 7, 6]
    big = HostModel.open(path)
    tight = HostModel.open(path, weight_budget=20_000)
    la = big.prefill(big.new_sequence(), ids)
    lb = tight.prefill(tight.new_sequence(), ids)
    assert np.allclose(la, lb, rtol=1e-5, atol=1e-5)
    assert tight.weights.held_bytes <= 20_000


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_2f", "q4tp"])
def test_decode_rows_equals_the_whole_decode(tmp_path, dtype):
    """Row bands and gathered rows of every dtype the host reads, against `CmfFile.array`."""
    w = np.random.default_rng(5).standard_normal((37, 64)).astype(np.float32)
    with CmfWriter(tmp_path / "w.cmf", {"arch": {}}) as wr:
        wr.add_array("w", w, dtype)
    cmf = CmfFile.open(tmp_path / "w.cmf")
    full = cmf.array("w")
    did = layout.dtype_id(cmf.tensors["w"].dtype)
    raw = cmf.tensor("w")
    assert np.array_equal(decode_rows(did, raw, (37, 64), slice(5, 21)), full[5:21])
    ids = np.array([36, 0, 5, 5])
    assert np.array_equal(decode_rows(did, raw, (37, 64), ids), full[ids])
