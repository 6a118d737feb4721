"""Field types both HTTP protocols validate alike, so a text the REST API refuses is refused by the
OpenAI-compatible API with the same message."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _encodable(value: str) -> str:
    # JSON can carry lone surrogates ("\ud800"); they would fail later, deep in the tokenizer.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_encodable)]
