"""Escaping external text (questions, search results, tool messages) before it enters the context.

A tokenizer turns the text of every added token (``<|im_end|>``, ``<|image_pad|>``, ``<tool_call>``,
``<think>``, ...) into that control token wherever it appears, so a question or a web page could end its
own turn, forge an image slot or fake a tool call. The list is derived from the tokenizer itself (its
added vocabulary), plus the format's own markers (``[IMAGE``, ``</tool_response>``, ...), and each match
is neutralised by replacing its first character with a full-width look-alike (``<`` -> ``＜``, as the
SSR reference harness does): the text stays readable and can no longer tokenise to a control token.

This is the one escaping function: the chat renderer (``agent.chat``) holds one per tokenizer and passes
every text a client or a tool wrote through it, tool definitions and candidate texts included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


def _neutralise(token: str) -> str:
    first = token[0]
    if "!" <= first <= "~":  # printable ASCII has a full-width twin 0xFEE0 above it
        return chr(ord(first) + 0xFEE0) + token[1:]
    return first + "\u2060" + token[1:]  # otherwise a word joiner splits the token's text


def added_tokens(tokenizer: Any) -> list[str]:
    """The contents of every added token of a Hugging Face tokenizer (special or not)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, Mapping):
        return [str(getattr(t, "content", t)) for t in decoder.values()]
    vocab = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return list(vocab)


class Escaper:
    """``escaper(text)`` -> the text with every control token and format marker neutralised."""

    def __init__(self, tokens: Iterable[str], markers: Mapping[str, str]) -> None:
        table = {t: _neutralise(t) for t in tokens if t}
        table.update(markers)  # the format's own replacements win (the reference's exact forms)
        self._table = table
        # longest first, so "<|im_start|>" is replaced whole rather than by the "<|" rule
        alternatives = sorted(table, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(a) for a in alternatives)) if alternatives else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, markers: Mapping[str, str]) -> Escaper:
        return cls(added_tokens(tokenizer), markers)

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._table[m.group(0)], text)
