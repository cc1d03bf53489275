"""The host arm's whole model on the tiny CMF of tests/unit/_tiny.py.

Against float64 (tests/unit/_ref64.py, same decoded weights): relative RMS of logits < 1e-4 and
argmax equal. Between host paths (decode steps vs one prefill, verify windows, snapshots):
relative RMS < 1e-5 (float32 reorderings only) and argmax equal.
"""

import numpy as np
import pytest

import _ref64 as ref
from _ref64 import rel_rms
import _tiny
from cortiq_drv.cmf import CmfFile
from cortiq_drv.errors import CortiqError
from cortiq_drv.host import HostModel

PROMPT = [5, 17, 300, 2, 99, 411, 23, 8, 150, 77, 3]


def close(a, b, tol=1e-5):
    assert rel_rms(a, b) < tol
    assert np.array_equal(np.argmax(a, axis=-1), np.argmax(b, axis=-1))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = _tiny.write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.cmf")
    return HostModel.open(path)


@pytest.mark.parametrize("style,quant", [("gemma", "q4tp"), ("qwen", "f32")])
def test_model_matches_float64(tmp_path, style, quant):
    """Embedding, 3 GDN layers, gated attention, dense FFNs, final norm and head, in chunks."""
    path = _tiny.write_tiny(tmp_path / "m.cmf", seed=1, quant=quant, norm_style=style)
    m = HostModel.open(path)
    cmf = CmfFile.open(path)
    r = ref.Model64(cmf.array, cmf.arch)
    seq = m.new_sequence()
    got = np.concatenate([m.prefill(seq, PROMPT[:7]), m.prefill(seq, PROMPT[7:])])
    want, _ = r.forward(PROMPT)
    close(got, want, 1e-4)


def test_decode_steps_equal_one_prefill(tiny):
    a = tiny.new_sequence()
    whole = tiny.prefill(a, PROMPT)
    b = tiny.new_sequence()
    steps = np.stack([tiny.decode(b, t) for t in PROMPT])
    close(steps, whole)
    assert a.pos == b.pos == len(PROMPT)
    for i in a.gdn:
        assert rel_rms(a.gdn_state(i), b.gdn_state(i)) < 1e-5


def _greedy(model, seq, first, n):
    """n greedy tokens decoded one by one after `first`, with each step's logits."""
    toks, logits, t = [], [], first
    for _ in range(n):
        lg = model.decode(seq, t)
        t = int(np.argmax(lg))
        toks.append(t)
        logits.append(lg)
    return toks, np.stack(logits)


@pytest.mark.parametrize("keep", [1, 2, 4], ids=["tip-only", "partial", "all"])
def test_verify_window_partial_accept_then_decode(tiny, keep):
    plain = tiny.new_sequence()
    last = int(np.argmax(tiny.prefill(plain, PROMPT)[-1]))
    want, want_lg = _greedy(tiny, plain, last, 8)
    spec = tiny.new_sequence()
    tiny.prefill(spec, PROMPT)
    # the window: the tip, then the right tokens up to `keep`, then wrong drafts
    window = [last] + want[:keep - 1] + [(t + 1) % 512 for t in want[keep - 1:3]]
    lg = tiny.verify(spec, window)
    close(lg[:keep], want_lg[:keep])
    spec.accept(keep)
    assert spec.pos == len(PROMPT) + keep
    got, got_lg = _greedy(tiny, spec, want[keep - 1], 8 - keep)
    assert got == want[keep:]
    close(got_lg, want_lg[keep:])


def test_accept_needs_a_window(tiny):
    seq = tiny.new_sequence()
    tiny.prefill(seq, PROMPT[:3])
    with pytest.raises(CortiqError, match="no verify window"):
        seq.accept(1)


def test_snapshot_restore_equals_recompute(tiny):
    turn1, turn2a, turn2b = PROMPT[:6], PROMPT[6:], [40, 41, 42]
    seq = tiny.new_sequence()
    tiny.prefill(seq, turn1)
    at = seq.snapshot()
    tiny.prefill(seq, turn2a)
    assert not seq.restore(at + 1)
    assert seq.restore(at)
    got = tiny.prefill(seq, turn2b)
    fresh = tiny.new_sequence()
    want = tiny.prefill(fresh, turn1 + turn2b)[len(turn1):]
    close(got, want)
    for i in seq.gdn:
        assert rel_rms(seq.gdn_state(i), fresh.gdn_state(i)) < 1e-5


def test_mtp_draft_matches_float64(tiny):
    cmf = tiny.cmf
    r = ref.Model64(cmf.array, cmf.arch)
    seq = tiny.new_sequence()
    out = tiny.run(seq, PROMPT)
    _, h64 = r.forward(PROMPT)
    tok = int(np.argmax(out.logits[-1]))
    got = tiny.mtp_draft(seq, out.hidden[-1], tok, len(PROMPT), 4)
    want = r.mtp_draft(h64[-1], tok, len(PROMPT), 4)
    assert got == want
    # the block's rows before the draft position are zero (never seen), then its 4 rows
    assert seq.mtp_kv.n == len(PROMPT) + 4
    assert not np.any(seq.mtp_kv.k[:, :len(PROMPT)])


@pytest.mark.parametrize("drafts_from", ["mtp", "oracle"])
def test_speculation_gives_the_greedy_text(tiny, drafts_from):
    """Draft 3, verify, accept the greedy prefix: the same tokens as plain greedy. `mtp`: the MTP
    block's drafts (random weights: mostly rejected); `oracle`: the true continuation with draft
    r % 4 of round r wrong, so windows keep 1, 2, 3, 4 rows in turn and the GDN replays chain."""
    plain = tiny.new_sequence()
    first = int(np.argmax(tiny.prefill(plain, PROMPT)[-1]))
    want, _ = _greedy(tiny, plain, first, 16)
    seq = tiny.new_sequence()
    out = tiny.run(seq, PROMPT, head="last")
    toks, tip, hidden, keeps = [first], first, out.hidden[-1], []
    while len(toks) < 17:
        if drafts_from == "mtp":
            drafts = tiny.mtp_draft(seq, hidden, tip, seq.pos, 3)
        else:
            at, wrong = len(toks) - 1, len(keeps) % 4
            drafts = [(t + (j == wrong)) % 512 for j, t in enumerate(want[at:at + 3])]
        res = tiny.run(seq, [tip] + drafts, window=True)
        pick = np.argmax(res.logits, axis=-1)
        keep = 1
        while keep <= len(drafts) and drafts[keep - 1] == pick[keep - 1]:
            keep += 1
        seq.accept(keep)
        keeps.append(keep)
        toks += [int(t) for t in pick[:keep]]
        tip, hidden = int(pick[keep - 1]), res.hidden[keep - 1]
    assert toks[1:17] == want
    if drafts_from == "oracle":
        assert keeps[:4] == [1, 2, 3, 4]


def test_errors_name_the_problem(tiny):
    seq = tiny.new_sequence()
    with pytest.raises(CortiqError, match="token id 512"):
        tiny.prefill(seq, [1, 512])
    with pytest.raises(CortiqError, match="context limit"):
        tiny.prefill(seq, [1] * 4097)
