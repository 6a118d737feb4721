"""Stop-string detection shared by both engines."""

from __future__ import annotations


def find_stop(text: str, stops: tuple[str, ...], search_from: int = 0) -> tuple[int, str] | None:
    """The earliest stop string in ``text[search_from:]``: (index, stop) or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, search_from)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
