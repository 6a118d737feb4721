"""Grammar-constrained decoding with xgrammar: compiled grammars cached per engine, a matcher per generation.

``GrammarCache`` owns ONE ``GrammarCompiler`` (over the tokenizer and the model's *padded* vocabulary, so
the bitmask covers every logit) and keeps compiled grammars by ``(kind, source)``: compiling a small JSON
schema costs ~0.5 s with the real Qwen vocabulary (4 ms with the tiny one), so it happens once per
grammar, off the worker thread (``TorchEngine.generate`` compiles in ``asyncio.to_thread`` before it
submits the job). JSON schemas compile with ``any_whitespace=False``: a weak model sampled under the
permissive form spent its whole budget on spaces and newlines (0 of 5 runs closed the object; the
embedded engine's page in docs/ tells the measurement).

``GrammarState`` is one generation's matcher and its next-token bitmask. The bitmask is refilled right
after each accepted token, which both masks the next step's logits and says whether the text is
complete: when no token but end-of-sequence is allowed the generation finishes there, without a
forward for the end token.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from ssr_server.core.errors import InvalidRequest, public_message
from ssr_server.core.protocol import Grammar

MAX_COMPILED = 256  # distinct grammars kept (tool schemas: a handful per deployment)


class GrammarCache:
    """Compiled grammars of one engine, by (kind, source); thread-safe; compile errors are cached too."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: frozenset[int], threads: int = 2) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = tuple(sorted(stop_ids))
        self._threads = max(1, threads)
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()  # value: CompiledGrammar | error
        self._non_stop = non_stop_words(vocab_size, self.stop_ids)
        # id(compiled) -> (it, the bitmask at its start, whether that mask masks anything): every
        # generation under a grammar starts from the same mask, copied instead of refilled (making a
        # state took 0.27 ms an action in `bench actions`, xgrammar's caches cold after the forwards;
        # 0.13 ms so); the grammar is held so that its id is not reused while its entry is here
        self._starts: OrderedDict[int, tuple[Any, torch.Tensor, bool]] = OrderedDict()
        self._starts_lock = threading.Lock()  # the event loop and compile threads both make states

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=list(self.stop_ids))
            self._compiler = xgr.GrammarCompiler(info, max_threads=self._threads)
        return self._compiler

    def compile(self, grammar: Grammar) -> Any:
        """The compiled grammar (xgrammar ``CompiledGrammar``); ``InvalidRequest`` if it does not compile."""
        key = (grammar.kind, grammar.source)
        with self._lock:  # one compile at a time: the compiler is shared and itself multi-threaded
            hit = self._compiled.get(key)
            if hit is None:
                hit = self._compile(grammar)
                self._compiled[key] = hit
                if len(self._compiled) > MAX_COMPILED:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(key)
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message)
        return hit

    def cached(self, grammar: Grammar) -> Any | None:
        """The compiled grammar if it is compiled already and the cache is free at once, else None
        (without waiting: the event loop calls this, and a compile can hold the lock ~0.5 s)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            hit = self._compiled.get((grammar.kind, grammar.source))
            if hit is not None:
                self._compiled.move_to_end((grammar.kind, grammar.source))
        finally:
            self._lock.release()
        if isinstance(hit, InvalidRequest):
            raise InvalidRequest(hit.message)
        return hit

    def _compile(self, grammar: Grammar) -> Any:
        compiler = self._get_compiler()
        try:
            if grammar.kind == "json_schema":
                json.loads(grammar.source)  # a clear message for text that is not JSON at all
                return compiler.compile_json_schema(grammar.source, any_whitespace=False)
            if grammar.kind == "ebnf":
                return compiler.compile_grammar(grammar.source)
            if grammar.kind == "regex":
                return compiler.compile_regex(grammar.source)
        except json.JSONDecodeError as exc:
            return InvalidRequest(f"the JSON schema is not valid JSON ({exc.msg} at character {exc.pos})")
        except Exception as exc:
            # xgrammar raises RuntimeError("[21:35:40] /project/cpp/json_schema_converter.cc:5082: properties
            # must be an object"): the reason is worth passing on, its log prefix is not.
            first = public_message(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
            what = {"json_schema": "JSON schema", "ebnf": "EBNF grammar", "regex": "regular expression"}
            return InvalidRequest(f"the {what.get(grammar.kind, grammar.kind)} cannot be used to constrain "
                                  f"decoding: {first[:300] or 'it does not compile'}")
        return InvalidRequest(f"unknown grammar kind {grammar.kind!r}; use json_schema, ebnf or regex")

    def state(self, compiled: Any) -> GrammarState:
        """A new generation's matcher under ``compiled``, at its start."""
        with self._starts_lock:
            start = self._starts.get(id(compiled))
        if start is not None:
            return GrammarState(compiled, self.vocab_size, self.stop_ids, self._non_stop, start[1:])
        state = GrammarState(compiled, self.vocab_size, self.stop_ids, self._non_stop)
        with self._starts_lock:
            self._starts[id(compiled)] = (compiled, state.bitmask.clone(), state.need_apply)
            if len(self._starts) > MAX_COMPILED:
                self._starts.popitem(last=False)
        return state


def non_stop_words(vocab_size: int, stop_ids: tuple[int, ...]) -> torch.Tensor:
    """(1, words) int32: every bit set but the stop tokens' and those past the vocabulary. AND-ing a
    bitmask with it leaves no bit set exactly when only end-of-sequence is allowed."""
    words = (vocab_size + 31) // 32
    keep = torch.full((words,), -1, dtype=torch.int64, device="cpu")
    for tok in (*stop_ids, *range(vocab_size, words * 32)):
        keep[tok // 32] &= ~(1 << (tok % 32))
    return ((keep + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32).view(1, words)


class GrammarState:
    """One generation's matcher; ``bitmask`` always holds the mask of the NEXT token."""

    def __init__(self, compiled: Any, vocab_size: int, stop_ids: tuple[int, ...],
                 non_stop: torch.Tensor | None = None, start: tuple[torch.Tensor, bool] | None = None,
                 ) -> None:
        """``non_stop``: ``non_stop_words(vocab_size, stop_ids)`` when the caller has it; ``start``: the
        bitmask of ``compiled`` at its start and whether it masks anything, when known (then copied)."""
        import xgrammar as xgr

        self._xgr = xgr
        self.compiled = compiled  # shared by every generation under the same grammar (GrammarCache)
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(stop_ids)
        words = (vocab_size + 31) // 32
        self._non_stop = non_stop if non_stop is not None else non_stop_words(vocab_size, stop_ids)
        # xgrammar fills the bitmask on the CPU (int32 words, bit j of word i = token 32 i + j).
        self.bitmask = (start[0].clone() if start is not None
                        else torch.full((1, words), -1, dtype=torch.int32, device="cpu"))
        # numpy views of the same memory: a bit test or an AND costs ~0.2 us instead of a torch op's ~5
        self._bits = self.bitmask.numpy()[0]
        self._non_stop_bits = self._non_stop.numpy()[0]
        self._device_mask: torch.Tensor | None = None
        self._need_apply = start[1] if start is not None else True
        if start is None:
            self._fill()

    @property
    def need_apply(self) -> bool:
        """Whether the current bitmask masks any token (xgrammar's answer at the last fill)."""
        return self._need_apply

    def _fill(self) -> None:
        self._need_apply = bool(self.matcher.fill_next_token_bitmask(self.bitmask))
        self._device_mask = None

    def mask(self, logits: torch.Tensor) -> None:
        """Set every logit the grammar forbids to -inf, in place; ``logits``: (vocab,) or (1, vocab)."""
        if not self._need_apply:
            return
        row = logits.view(1, -1)
        if row.device.type == "cpu":
            self._xgr.apply_token_bitmask_inplace(row, self.bitmask, vocab_size=self.vocab_size)
            return
        if self._device_mask is None:
            self._device_mask = self.bitmask.to(row.device, non_blocking=True)
        self._xgr.apply_token_bitmask_inplace(row, self._device_mask, vocab_size=self.vocab_size,
                                              backend="torch_native")

    def allows(self, token: int) -> bool:
        """Whether the grammar admits ``token`` next."""
        return not self._need_apply or bool((int(self._bits[token >> 5]) >> (token & 31)) & 1)

    def fresh_matcher(self) -> Any:
        """A matcher of the same grammar at its start."""
        return self._xgr.GrammarMatcher(self.compiled)

    def admitted(self, limit: int) -> list[int] | None:
        """The tokens the grammar admits next, end-of-sequence left out; None when more than ``limit``
        (or all: no mask)."""
        if not self._need_apply:
            return None
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        if int(np.count_nonzero(bits)) > limit + len(self.stop_ids):
            return None
        out = [int(t) for t in np.flatnonzero(bits) if t < self.vocab_size and int(t) not in self.stop_ids]
        return out if len(out) <= limit else None

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False when the grammar rejects it (then nothing changed)."""
        if not self.matcher.accept_token(token):
            return False
        if not self.matcher.is_terminated():
            self._fill()
        return True

    def jump_forward(self) -> tuple[list[int], str]:
        """The text the grammar forces from here, and its tokens as xgrammar spells them (without a
        last piece that a longer token could extend: the caller may spell that rest itself)."""
        if self.matcher.is_terminated():
            return [], ""
        return list(self.matcher.find_jump_forward_tokens()), str(self.matcher.find_jump_forward_string())

    @property
    def complete(self) -> bool:
        """The text is complete: the grammar allows nothing but end-of-sequence (or accepted it)."""
        if self.matcher.is_terminated():
            return True
        if not self._need_apply:
            return False
        return not (self._bits & self._non_stop_bits).any()
