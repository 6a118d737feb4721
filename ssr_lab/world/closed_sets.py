"""The closed answer sets of questions read from pixels, and the colours they are drawn in.

A tiny vision-language model (hidden 128-256, two vision layers, trained for minutes on a CPU) has to
learn to read these answers from the pictures, so every set is small and every value is drawn big and
unmistakable: eight well-separated colours, six shapes, counts 1-6 and sixteen characters chosen so that
no two look alike (no 0/O, 1/I, 5/S, 8/B pairs).
"""

from __future__ import annotations

RGB = tuple[int, int, int]

COLOURS: dict[str, RGB] = {
    "red": (205, 35, 40),
    "orange": (240, 130, 25),
    "yellow": (245, 210, 40),
    "green": (45, 155, 65),
    "blue": (35, 90, 210),
    "purple": (130, 60, 170),
    "white": (248, 248, 248),
    "black": (25, 25, 25),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "hexagon")
COUNTS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
CHARS: tuple[str, ...] = tuple("2345679ACEHKMPRX")
DIGITS: frozenset[str] = frozenset(c for c in CHARS if c.isdigit())



def char_kind(char: str) -> str:
    """"number" or "letter": the word a question uses for a painted character."""
    return "number" if char in DIGITS else "letter"
