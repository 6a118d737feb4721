"""Drafts for a decode step: the grammar's forced text (jump-forward) and prompt lookup.

A decode step feeds the token just chosen followed by a *draft* of the tokens likely to come next,
and the same forward gives the logits after each of them. The scheduler then verifies the draft
token by token with the sequence's own sampler under its grammar (``Decoder.verify``): a draft
token is kept only when the token the step would have chosen anyway is that token, so the text is
exactly what one-token-per-forward decoding writes, greedy or seeded (each produced token still
costs one draw of the sequence's generator, in the same order). A draft only saves forwards.

Two sources, in this order (nano-vllm keeps none of this; SGLang has both, vLLM the second):

- **jump-forward**: what the grammar forces from here (the keys, quotes and brackets of a tool
  call's JSON, the closing of an answer), as xgrammar's ``find_jump_forward_tokens`` spells it. Its
  spelling may differ from the model's tokenisation at a boundary; verification settles that.
- **prompt lookup** (n-gram speculation): the newest earlier occurrence, in the sequence's own
  context and output, of its last n tokens (n from ``ngram_max`` down to ``ngram_min``), and the
  tokens that followed it, up to the draft's limit whatever n (a guess after a one- or two-token
  match once drafted at most 2n tokens: more of it was kept, but with tree drafts and learnt endings
  beside it the whole guess takes fewer forwards, 3.45 -> 3.18 an action on the 5,000-entity world's
  test split, at the same action time or 2% less; A/B in one process). An action mostly copies: an
  entity name from a search title into a query, an answer from a snippet, a zoom label from the
  question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.grammar import GrammarState


@dataclass(frozen=True, slots=True)
class DraftConfig:
    max_tokens: int = 8  # drafted tokens per step at most (0: no drafts)
    jump_forward: bool = True
    prompt_lookup: bool = True
    ngram_max: int = 4
    ngram_min: int = 1
    # Where the grammar forces nothing and admits 2..branches tokens next (a digit of a number), draft
    # one chain per admitted token (a tree): the one the model picks is verified, so the step keeps
    # two tokens whatever the model writes. 0 or 1: linear drafts only.
    branches: int = 16
    # One chain per step, each of its rows computed alone, as a one-token step would compute it
    # (``Chunk.alone_from``): no tree (its chains do not see one another, so a row's keys are not the
    # prefix a one-token step attends to)
    exact: bool = False

    @classmethod
    def of(cls, config: EngineConfig, on: bool = True) -> DraftConfig:
        """The drafts an engine configuration asks for (``on``: False gives none)."""
        return cls(config.speculative_tokens if on else 0, config.jump_forward, config.prompt_lookup,
                   branches=0 if config.exact else config.speculative_branches, exact=config.exact)

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0 and (self.jump_forward or self.prompt_lookup)


ENDING_MAX = 32  # tokens of a learnt ending drafted at most


class TokenHistory:
    """A sequence's tokens (context, then output) in a growable numpy buffer, for n-gram search."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self._buf = np.empty(max(64, 2 * len(tokens)), dtype=np.int64)
        self._buf[: len(tokens)] = tokens
        self.length = len(tokens)

    def extend(self, tokens: list[int]) -> None:
        need = self.length + len(tokens)
        if need > len(self._buf):
            grown = np.empty(2 * need, dtype=np.int64)
            grown[: self.length] = self._buf[: self.length]
            self._buf = grown
        self._buf[self.length : need] = tokens
        self.length = need

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def lookup(self, tail: list[int], cfg: DraftConfig, limit: int, vocab_size: int) -> list[int]:
        """Up to ``limit`` tokens that followed the newest earlier occurrence of the longest suffix of
        (history + ``tail``) of ``ngram_max`` .. ``ngram_min`` tokens."""
        if limit <= 0:
            return []
        hist = self._buf[: self.length]
        seq = np.concatenate([hist, np.asarray(tail, dtype=np.int64)]) if tail else hist
        n_all = len(seq)
        for n in range(min(cfg.ngram_max, n_all - 1), cfg.ngram_min - 1, -1):
            suffix = seq[n_all - n :]
            # candidate starts i with seq[i : i + n] == suffix and i + n < n_all (something follows)
            hits = seq[: n_all - n] == suffix[0]
            for j in range(1, n):
                hits &= seq[j : n_all - n + j] == suffix[j]
            starts = np.flatnonzero(hits)
            if len(starts):
                i = int(starts[-1]) + n
                out = seq[i : i + limit]
                # the cache key stands for an image by placeholder ids outside the vocabulary
                bad = np.flatnonzero((out < 0) | (out >= vocab_size))
                return [int(x) for x in out[: bad[0] if len(bad) else len(out)]]
        return []


class Spelling(Protocol):
    def decode(self, ids: list[int]) -> str: ...
    def encode(self, text: str) -> list[int]: ...


def forced(grammar: GrammarState, spell: Spelling) -> list[int]:
    """The tokens of the text ``grammar`` forces: xgrammar's, then the rest it leaves out (a last
    piece a longer token could extend, such as the quote that opens a string) as the tokenizer
    spells it: the model usually writes that piece alone, and a wrong guess costs nothing."""
    tokens, text = grammar.jump_forward()
    if not text:
        return tokens
    done = spell.decode(tokens) if tokens else ""
    if text.startswith(done) and len(text) > len(done):
        tokens = tokens + spell.encode(text[len(done):])
    return tokens


def _linear(grammar: GrammarState | None, history: TokenHistory, tail: list[int], cfg: DraftConfig,
            limit: int, vocab_size: int, spell: Spelling) -> tuple[list[int], bool]:
    """The linear draft (at most ``limit`` tokens), and whether it starts with text the grammar forces."""
    out: list[int] = []
    if cfg.jump_forward and grammar is not None and not grammar.complete:
        out = forced(grammar, spell)[:limit]
    was_forced = bool(out)
    if cfg.prompt_lookup and len(out) < limit:
        out += history.lookup(tail + out, cfg, limit - len(out), vocab_size)
    return out, was_forced


def draft(grammar: GrammarState | None, history: TokenHistory, tail: list[int], cfg: DraftConfig,
          limit: int, vocab_size: int, spell: Spelling) -> list[int]:
    """The draft after ``history`` + ``tail`` (``grammar`` already past ``tail``): at most ``limit``."""
    limit = min(limit, cfg.max_tokens)
    if limit <= 0:
        return []
    return _linear(grammar, history, tail, cfg, limit, vocab_size, spell)[0]


def chains(grammar: GrammarState | None, history: TokenHistory, tail: list[int], cfg: DraftConfig,
           depth: int, rows: int, vocab_size: int, spell: Spelling,
           ending: Sequence[int] = ()) -> list[list[int]]:
    """A decode step's draft after ``tail`` (its fed token, ``grammar`` already past it), as chains that
    each follow the fed token and start with distinct tokens: none, one (the linear ``draft``), or a
    tree. Where the grammar forces nothing:

    - when it admits 2..``cfg.branches`` tokens besides end-of-sequence, one chain per admitted token
      (the linear draft's first token keeps the rest of that draft as its chain);
    - when it admits the first token of ``ending`` (how the last generation under this grammar ended:
      ``ending_of``), that ending as a chain too: the step that writes a value's last word may also
      close it.

    ``depth``: tokens the generation may still write; ``rows``: draft tokens the forward has room for."""
    limit = min(depth, rows, cfg.max_tokens)
    if limit <= 0:
        return []
    line, was_forced = _linear(grammar, history, tail, cfg, limit, vocab_size, spell)
    if was_forced or grammar is None or grammar.complete:
        return [line] if line else []
    out = [line] if line else []
    admitted = grammar.admitted(min(cfg.branches, rows)) if cfg.branches >= 2 else None
    if admitted is not None and len(admitted) >= 2:
        out = [[t] for t in admitted]
        if line and line[0] in admitted:  # the lookup's guess goes deeper along its own branch
            out[admitted.index(line[0])] = line[: max(1, min(limit, rows - len(admitted) + 1))]
    if ending and grammar.allows(ending[0]):
        # past its first token an ending was forced text: all of it, not just max_tokens, is kept
        # whenever the model picks that first token
        deep = min(depth, rows, ENDING_MAX)
        spare = rows - sum(len(c) for c in out)
        firsts = [c[0] for c in out]
        if ending[0] not in firsts and spare >= 1:
            out.append(list(ending[: min(deep, spare)]))
        elif ending[0] in firsts and len(out[firsts.index(ending[0])]) == 1:  # a bare branch: extend it
            out[firsts.index(ending[0])] = list(ending[: min(deep, spare + 1)])
    return out


def ending_of(grammar: GrammarState, tokens: Sequence[int]) -> list[int]:
    """The ending of a generation that completed ``grammar`` with ``tokens``: from its last token the
    grammar did not force (a closing quote, an answer's closing tag) to the end. Replayed on a fresh
    matcher, so the generation's own one is left as it is. [] when the replay does not accept them."""
    matcher = grammar.fresh_matcher()
    start = 0
    for i, tok in enumerate(tokens):
        if not matcher.find_jump_forward_string():
            start = i
        if not matcher.accept_token(tok):
            return []
    return list(tokens[start:])
