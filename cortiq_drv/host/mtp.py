"""The MTP block's greedy drafts on the host (docs/MODEL.md "MTP block"; the reference's
`mtp_chain`, one step after another instead of one graph).
"""

from __future__ import annotations

import numpy as np

from ..errors import CortiqError
from .ops import rms_norm


def block_halves(model, h: np.ndarray, t: int) -> np.ndarray:
    """What eh_proj takes for token t after residual row h [1, hidden]: [1, 2 hidden] =
    [RMSNorm(embed(t), 1 + enorm) ; RMSNorm(h, 1 + hnorm)]."""
    g = model.graph
    m = g.mtp
    e = rms_norm(model.embed([t]), m.enorm, g.eps, g.gemma)
    hn = rms_norm(h, m.hnorm, g.eps, g.gemma)
    return np.concatenate([e, hn], axis=1)


def block_input(model, h: np.ndarray, t: int) -> np.ndarray:
    """The MTP block's input row [1, hidden] for token t after residual row h [1, hidden]:
    eh_proj[RMSNorm(embed(t), 1 + enorm) ; RMSNorm(h, 1 + hnorm)]."""
    return model.mm(model.graph.mtp.eh, block_halves(model, h, t))


def draft(model, seq, hidden: np.ndarray, token: int, position: int, k: int,
          rows: int | None = None) -> list[int]:
    """k greedy draft ids after `token`, which sits at `position`; `hidden` [hidden] is the trunk's
    residual row (before the final norm) at position - 1, the row whose logits gave `token`.

    Step j puts the block's row at position + j: input eh_proj[RMSNorm(embed(t_j), 1 + enorm) ;
    RMSNorm(h_j, 1 + hnorm)], h_0 = `hidden`, then h_j the block's own output row. The block's K/V
    rows go back to `position` first, zero rows filling positions it never saw (the reference's
    `admit`). The draft is the argmax over the head's first `rows` logits (default all: the
    reference's shortlist; pass the tokenizer's real size to keep padding ids out)."""
    g = model.graph
    m = g.mtp
    if m is None:
        raise CortiqError("mtp_draft: the model has no MTP block (model.mtp.fc.weight)")
    if k < 1:
        raise CortiqError(f"mtp_draft: {k} drafts")
    if g.max_positions and position + k > g.max_positions:
        raise CortiqError(f"mtp_draft: draft rows to {position + k} pass the context limit "
                          f"{g.max_positions}")
    kv = seq.mtp_kv
    kv.truncate(position)
    kv.fill_zero(position)
    h = np.asarray(hidden, dtype=np.float32).reshape(1, g.hidden)
    t = int(token)
    out = []
    for j in range(k):
        x = block_input(model, h, t)  # [1, hidden]
        cos, sin = model.rope(position + j, 1)
        h, _ = model.layer(x, m.layer, kv, position + j, cos, sin)
        logits = model.head(h, m.final_norm)[0]
        t = int(np.argmax(logits[:rows]))
        out.append(t)
    return out
