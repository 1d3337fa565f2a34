"""The tokens the simulator generates, pre-rendered as JSON so that a response costs O(1) Python work.

Every request produces the same sequence: token i is ``WORDS[i % 10]`` with id ``1000 + i % 10``. There is no
EOS, so a request always generates exactly ``max_new_tokens`` tokens (SGLang with ``ignore_eos``).
"""

from __future__ import annotations

WORDS = [" the", " model", " speaks", " tokens", " quickly", " and", " well", ".", " A", " draft"]


class OutputTape:
    """The generated tokens' ids and text, as two growing byte strings.

    The JSON of the first n ids and the text of the first n tokens are prefixes of those strings, so a
    cumulative streaming event is two slices and a delta is one.
    """

    def __init__(self) -> None:
        self.ids = bytearray()
        self.ids_end: list[int] = [0]
        self.text = bytearray()
        self.text_end: list[int] = [0]

    def ensure(self, n: int) -> None:
        """Render the first n tokens (call before a request that generates n is admitted)."""
        while len(self.ids_end) <= n:
            i = len(self.ids_end) - 1
            self.ids += (b"," if i else b"") + str(1000 + i % len(WORDS)).encode()
            self.ids_end.append(len(self.ids))
            self.text += WORDS[i % len(WORDS)].encode()
            self.text_end.append(len(self.text))

    def ids_json(self, n: int) -> bytes:
        return b"[" + bytes(self.ids[: self.ids_end[n]]) + b"]"

    def text_str(self, n: int) -> str:
        return self.text[: self.text_end[n]].decode()

    def text_json(self, n: int) -> bytes:
        return b'"' + bytes(self.text[: self.text_end[n]]) + b'"'

    def delta_text(self, a: int, b: int) -> str:
        return self.text[self.text_end[a] : self.text_end[b]].decode()
