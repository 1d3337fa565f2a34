"""The tokens the simulator generates, pre-rendered as JSON so that a response costs O(1) Python work.

Every request produces the same sequence: token i is ``WORDS[i % 10]`` with id ``1000 + i % 10``. There is no
EOS, so a request always generates exactly ``max_new_tokens`` tokens (SGLang with ``ignore_eos``).
"""

from __future__ import annotations

import json
import random

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


class CorruptedTokens:
    """One request's output under ``corrupt_token_share``: the tape with some positions replaced.

    Position i is corrupted when the i-th draw of a RNG seeded with the prompt's key is below the share, so the
    same prompt gets the same wrong tokens on every request (a deterministic bug, as a miswired drafter is). A
    corrupted token has id ``2000 + i % 10`` and the text " wrong". Same interface as :class:`OutputTape`'s reads.
    """

    def __init__(self, tape: OutputTape, prompt_key: int, share: float, n: int) -> None:
        rng = random.Random(prompt_key)
        self.bad = {i for i in range(n) if rng.random() < share}
        self.ids = [2000 + i % len(WORDS) if i in self.bad else 1000 + i % len(WORDS) for i in range(n)]
        self.words = [" wrong" if i in self.bad else WORDS[i % len(WORDS)] for i in range(n)]

    def ids_json(self, n: int) -> bytes:
        return json.dumps(self.ids[:n], separators=(",", ":")).encode()

    def text_str(self, n: int) -> str:
        return "".join(self.words[:n])

    def text_json(self, n: int) -> bytes:
        return json.dumps(self.text_str(n)).encode()

    def delta_text(self, a: int, b: int) -> str:
        return "".join(self.words[a:b])
