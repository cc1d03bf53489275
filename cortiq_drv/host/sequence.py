"""One sequence's state on the host arm: K/V rows per attention layer, GDN state per GDN layer,
the MTP block's K/V rows, a pending verify window and a GDN snapshot.

Ports the per-sequence parts of the reference's `State` (`KvMirror` rows, `GdnState` with its
tape, `gdn_snapshot`), kept on the host: `HybridGraph.bind(seq)` hands them to the CUDA arm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CortiqError
from .attention import KvRows
from .gdn import GdnState


@dataclass
class Window:
    """A verify window: n rows from position pos0, each GDN layer's tape by layer index."""

    pos0: int
    n: int
    tapes: dict


class Sequence:
    """Rows [0, pos) of one sequence. `kv[i]`: attention layer i's K/V store (`KvRows`, or a
    stand-in with its protocol such as a sealed far field); `gdn[i]`: GDN layer i's state;
    `mtp_kv`: the MTP block's K/V rows (None without one)."""

    def __init__(self, kv: dict[int, KvRows], gdn: dict[int, GdnState], mtp_kv: KvRows | None):
        self.kv = kv
        self.gdn = gdn
        self.mtp_kv = mtp_kv
        self.pos = 0
        self.window: Window | None = None
        self._snap: tuple[int, dict[int, np.ndarray]] | None = None

    def _truncate(self, pos: int) -> None:
        for kv in self.kv.values():
            kv.truncate(pos)
        if self.mtp_kv is not None:
            self.mtp_kv.truncate(pos)
        self.pos = pos
        self.window = None

    def commit(self) -> None:
        """Keep every row of a pending verify window (a no-op without one)."""
        self.window = None

    def accept(self, keep: int) -> None:
        """Keep the first `keep` rows of the pending verify window: attention layers forget the
        rest, GDN layers go back to the window start and replay the kept rows from their tapes
        (the reference's `spec_restore`). The MTP rows past the kept ones go too."""
        w = self.window
        if w is None:
            raise CortiqError("accept: no verify window is pending on this sequence")
        if not 0 <= keep <= w.n:
            raise CortiqError(f"accept: {keep} rows of a window of {w.n}")
        if keep < w.n:
            for i, tape in w.tapes.items():
                tape.replay(self.gdn[i], keep)
            self._truncate(w.pos0 + keep)
        self.window = None

    def snapshot(self) -> int:
        """Copy every GDN state at the current position (`gdn_snapshot`); returns that position.
        One snapshot a sequence: a new one replaces the old."""
        self.commit()
        self._snap = (self.pos, {i: st.buf.copy() for i, st in self.gdn.items()})
        return self.pos

    def restore(self, pos: int) -> bool:
        """Back to the snapshot at `pos` (`gdn_snapshot_restore`): GDN states from it, K/V rows cut
        to pos. False, nothing changed, unless the snapshot is at `pos` and pos <= the position."""
        if self._snap is None or self._snap[0] != pos or pos > self.pos:
            return False
        for i, buf in self._snap[1].items():
            self.gdn[i].load(buf)
        self._truncate(pos)
        return True

    def gdn_state(self, layer: int) -> np.ndarray:
        """Layer's GDN state, `[ring | S]` as the reference's `gdn_state_read` returns it (a copy)."""
        return self.gdn[layer].buf.copy()

