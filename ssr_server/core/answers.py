"""Answer matching: one normaliser and one rule, deterministic and documented.

``normalise_answer`` maps a string to a canonical token string:

1. Unicode compatibility decomposition; accents dropped (``Dalí`` -> ``dali``), ``ø æ œ ß`` spelled out;
2. case folded;
3. thousands separators dropped between digits (``2,180`` -> ``2180``), decimal points kept, a
   trailing ``.0`` dropped (``120.0`` -> ``120``);
4. every other character that is not a letter, digit or space becomes a space (``km/h`` -> ``km h``);
5. the articles ``a``, ``an``, ``the`` dropped wherever they stand before another word (a final
   ``a`` is the letter: ``Plan A`` -> ``plan a``);
6. number words zero to twenty become digits (``four`` -> ``4``);
7. whitespace collapsed.

``is_correct(prediction, gold, aliases)`` is true when the normalised prediction equals the normalised
gold answer or an alias, or when it *contains* one of them as a contiguous run of tokens, is at most
``MAX_EXTRA_TOKENS`` tokens longer, and names no number that the matched target does not (so
``"built in 1874"`` matches ``1874``, but ``"1874 or 1875"`` does not).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

NUMBER_WORDS: tuple[str, ...] = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)
MAX_EXTRA_TOKENS = 4
_SPELLED = str.maketrans({"ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ß": "ss"})
_ARTICLES = frozenset({"a", "an", "the"})
_WORD_NUMBERS = {w: str(i) for i, w in enumerate(NUMBER_WORDS)}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_TRAILING_ZERO = re.compile(r"(?<=\d)\.0+(?!\d)")
_NOT_WORD = re.compile(r"[^\w\s.]|_")
_LONE_DOT = re.compile(r"(?<!\d)\.|\.(?!\d)")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")


def normalise_answer(text: str) -> str:
    s = unicodedata.normalize("NFKD", text.translate(_SPELLED))
    s = "".join(ch for ch in s if not unicodedata.combining(ch)).casefold()
    s = _TRAILING_ZERO.sub("", _THOUSANDS.sub("", s))
    s = _LONE_DOT.sub(" ", _NOT_WORD.sub(" ", s))
    words = s.split()
    # An article is dropped only before another word: a lone or final "a" is the letter A.
    last = len(words) - 1
    tokens = [_WORD_NUMBERS.get(t, t) for i, t in enumerate(words) if t not in _ARTICLES or i == last]
    return " ".join(tokens)


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def is_correct(prediction: str, gold: str, aliases: Iterable[str] = ()) -> bool:
    pred = normalise_answer(prediction).split()
    if not pred:
        return False
    for target in (gold, *aliases):
        want = normalise_answer(target).split()
        if not want:
            continue
        if pred == want:
            return True
        stray_numbers = {t for t in pred if _NUMBER.match(t)} - set(want)
        if len(pred) <= len(want) + MAX_EXTRA_TOKENS and not stray_numbers and _contains(pred, want):
            return True
    return False
