"""Drafts (jump-forward, prompt lookup) verified in the decode step: the same text as one token per
forward, greedy and seeded, under grammars, stop strings and budgets; fewer forwards where text is
forced or copied."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from ssr_server.core.protocol import Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.speculate import DraftConfig, TokenHistory

CFG = DraftConfig(max_tokens=8)


# ---------------------------------------------------------------- prompt lookup


def test_lookup_continues_the_newest_occurrence_of_the_longest_suffix() -> None:
    h = TokenHistory([1, 2, 3, 9, 9, 5, 2, 3, 4, 7, 8, 6])
    # the suffix (2, 3) occurs at 1 and 6: the newest (6) wins, its continuation follows
    assert h.lookup([2, 3], CFG, 3, vocab_size=100) == [4, 7, 8]
    # a longer suffix beats a newer shorter one: (9, 5, 2) occurs once
    assert h.lookup([9, 5, 2], CFG, 2, vocab_size=100) == [3, 4]
    assert h.lookup([42], CFG, 3, vocab_size=100) == []  # nowhere
    assert h.lookup([2, 3], CFG, 0, vocab_size=100) == []
    h.extend([2, 3, 11])
    assert h.lookup([2, 3], CFG, 1, vocab_size=100) == [11]
    assert h.lookup([2, 3], DraftConfig(ngram_min=3), 2, vocab_size=100) == []  # too short a match


def test_a_one_token_match_drafts_its_whole_guess() -> None:
    # (5) alone matches: what followed it, up to the limit, not a shorter guess for a short match
    h = TokenHistory([5, 1, 2, 3, 4, 6, 7, 8, 9])
    assert h.lookup([5], CFG, 6, vocab_size=100) == [1, 2, 3, 4, 6, 7]


def test_lookup_never_drafts_an_image_placeholder() -> None:
    h = TokenHistory([5, 6, -77, -77, 8, 5, 6])
    assert h.lookup([], CFG, 4, vocab_size=100) == []  # (5, 6) is followed by a placeholder at once
    h2 = TokenHistory([5, 6, 7, 150, 9, 5, 6])
    assert h2.lookup([], CFG, 4, vocab_size=100) == [7]  # cut before a token the model does not have


# ---------------------------------------------------------------- against one token per forward

SCHEMA = json.dumps({
    "type": "object", "additionalProperties": False, "required": ["entity_name_to_look_up", "attribute"],
    "properties": {"entity_name_to_look_up": {"type": "string", "maxLength": 24},
                   "attribute": {"type": "string", "enum": ["height", "width", "year completed"]}}})


@pytest.fixture(scope="module")
def engines(lm: LoadedModel) -> Any:
    plain = TorchEngine(lm, EngineConfig(speculative_tokens=0))
    drafting = TorchEngine(lm, EngineConfig(speculative_tokens=8))
    yield plain, drafting
    for e in (plain, drafting):
        asyncio.run(e.close())


def _ctx(tok: Any, text: str) -> Context:
    return Context(tuple(tok.encode(text, add_special_tokens=False)))


async def _echo_context(engine: TorchEngine, tok: Any) -> Context:
    """A context in which the model has already written what it tends to write next (its own greedy
    continuation, then the same opening again): prompt lookup drafts it, and parts of it are right."""
    base = _ctx(tok, "the entity_name_to_look_up is Raltard Nocturne, year completed 1878. ")
    own = await engine.generate(base, GenerationParams(max_new_tokens=24, ignore_eos=True))
    return Context(base.token_ids + own.token_ids + base.token_ids)


CASES: list[tuple[str, GenerationParams]] = [
    ("greedy", GenerationParams(max_new_tokens=40)),
    ("grammar", GenerationParams(max_new_tokens=60, grammar=Grammar("json_schema", SCHEMA))),
    ("budget cut mid-draft", GenerationParams(max_new_tokens=7, grammar=Grammar("json_schema", SCHEMA))),
    ("stop string", GenerationParams(max_new_tokens=40, stop=("ar", "e"))),
    ("stop string late", GenerationParams(max_new_tokens=40, stop=("1878",))),
    ("no eos", GenerationParams(max_new_tokens=30, ignore_eos=True)),
    ("seeded sampling", GenerationParams(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=7)),
    ("seeded sampling, grammar", GenerationParams(max_new_tokens=60, temperature=1.3, seed=3,
                                                  grammar=Grammar("json_schema", SCHEMA))),
]


def _same(a: Generation, b: Generation) -> None:
    assert (a.token_ids, a.text, a.finish_reason, a.stop_text) == (b.token_ids, b.text, b.finish_reason,
                                                                   b.stop_text)


@pytest.mark.parametrize("name,params", CASES, ids=[c[0] for c in CASES])
def test_drafts_write_what_one_token_per_forward_writes(engines: Any, tok: Any, name: str,
                                                        params: GenerationParams) -> None:
    plain, drafting = engines
    ctx = asyncio.run(_echo_context(plain, tok))

    async def both() -> tuple[Generation, Generation]:
        return await plain.generate(ctx, params), await drafting.generate(ctx, params)

    a, b = asyncio.run(both())
    _same(a, b)
    assert a.forwards >= len(a.token_ids) - 1  # one token per forward (the last needs none)
    assert b.forwards <= a.forwards
    if name in ("greedy", "grammar", "no eos"):  # long enough for drafts to be kept
        assert b.timings["accepted"] > 0 and b.forwards < a.forwards


def test_a_finish_inside_a_draft_is_cached_as_one_token_decoding_caches_it(engines: Any, tok: Any) -> None:
    """The grammar forces the closing of the JSON, so the drafting engine keeps the last token from a
    draft row (its KV computed); one-token decoding never feeds its last token. Both cache the context
    and the output but its last token: the next turn's context is then split where it is in both."""
    plain, drafting = engines
    params = GenerationParams(max_new_tokens=60, grammar=Grammar("json_schema", SCHEMA))
    ctx = _ctx(tok, "Look it up again: ")
    for engine in (plain, drafting):
        gen = asyncio.run(engine.generate(ctx, params))
        assert gen.finish_reason == "stop" and gen.text.endswith("}")
        match = engine.prefix_cache.lookup(ctx.token_ids + gen.token_ids)
        assert match is not None and match.length == len(ctx.token_ids) + len(gen.token_ids) - 1
        assert match.entry.key == ctx.token_ids + gen.token_ids[:-1]
        assert match.entry.kv.length == len(match.entry.key)
    assert gen.timings["accepted"] > 0


@pytest.fixture(scope="module")
def bf16_engines(tiny_dir: Any) -> Any:
    """bf16: exact drafts by default where drafts are on (``exact_drafts=auto``); the one-token engine
    asks for the same numerics."""
    from ssr_server.engine.torch.loader import load_model

    lm = load_model(str(tiny_dir), EngineConfig(dtype="bf16"))
    plain = TorchEngine(lm, EngineConfig(dtype="bf16", speculative_tokens=0, exact_drafts="on"))
    drafting = TorchEngine(lm, EngineConfig(dtype="bf16", speculative_tokens=8))
    yield plain, drafting
    for e in (plain, drafting):
        asyncio.run(e.close())


@pytest.mark.parametrize("name,params", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_exact_drafts_in_bf16_write_what_one_token_per_forward_writes(bf16_engines: Any, tok: Any, name: str,
                                                                     params: GenerationParams) -> None:
    plain, drafting = bf16_engines
    assert drafting.config.exact and drafting.scheduler.drafter.config.branches == 0
    assert drafting.runner.min_rows == plain.runner.min_rows == 2
    ctx = asyncio.run(_echo_context(plain, tok))

    async def both() -> tuple[Generation, Generation]:
        return await plain.generate(ctx, params), await drafting.generate(ctx, params)

    a, b = asyncio.run(both())
    _same(a, b)
    if name != "budget cut mid-draft":
        assert b.timings["accepted"] > 0 and b.forwards < a.forwards


def test_concurrent_drafting_generations_each_write_their_own_text(engines: Any, tok: Any) -> None:
    """Drafts of several runs verified in the same forward, beside runs without any."""
    plain, drafting = engines
    texts = [f"item {i}: alpha beta gamma delta alpha beta gamma delta {i} " * 2 for i in range(5)]
    params = [GenerationParams(max_new_tokens=24), GenerationParams(max_new_tokens=40,
                                                                   grammar=Grammar("json_schema", SCHEMA))]

    async def run(engine: TorchEngine) -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(_ctx(tok, t), params[i % 2])
                                           for i, t in enumerate(texts))))

    for a, b in zip(asyncio.run(run(plain)), asyncio.run(run(drafting)), strict=True):
        _same(a, b)
    assert drafting.scheduler.max_batch >= 2


def test_forced_text_takes_fewer_forwards(engines: Any, tok: Any) -> None:
    """The keys and brackets of the schema are drafted by jump-forward and always kept."""
    plain, drafting = engines
    params = GenerationParams(max_new_tokens=60, grammar=Grammar("json_schema", SCHEMA))
    ctx = _ctx(tok, "Look it up: ")

    async def both() -> tuple[Generation, Generation]:
        return await plain.generate(ctx, params), await drafting.generate(ctx, params)

    a, b = asyncio.run(both())
    _same(a, b)
    assert b.timings["accepted"] > 0
    assert b.forwards < a.forwards


def test_a_forced_generation_is_drafted_in_its_prompts_forward(engines: Any, lm: LoadedModel,
                                                              tok: Any) -> None:
    """The draft after the prompt rides in the prompt's own forward: when the grammar forces every
    token, the generation is (nearly) over when its prompt is. (The forced text's spelling is
    xgrammar's; where this random model spells a piece otherwise, one decode step follows.)"""
    plain, _ = engines
    drafting = TorchEngine(lm, EngineConfig(speculative_tokens=32))
    forced = json.dumps({"type": "object", "additionalProperties": False, "required": ["img_idx"],
                         "properties": {"img_idx": {"const": 0}}})
    params = GenerationParams(max_new_tokens=30, grammar=Grammar("json_schema", forced))
    ctx = _ctx(tok, "Search with the picture: ")

    async def both() -> tuple[Generation, Generation]:
        return await plain.generate(ctx, params), await drafting.generate(ctx, params)

    try:
        a, b = asyncio.run(both())
    finally:
        asyncio.run(drafting.close())
    _same(a, b)
    assert json.loads(a.text) == {"img_idx": 0}
    assert a.forwards >= len(a.token_ids) - 1 and b.forwards <= 1


# ---------------------------------------------------------------- tree drafts

NUMBERS = json.dumps({
    "type": "object", "additionalProperties": False, "required": ["bbox_2d", "label"],
    "properties": {"bbox_2d": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1000},
                               "minItems": 4, "maxItems": 4},
                   "label": {"type": "string", "maxLength": 12}}})


def _state(engine: TorchEngine, schema: str) -> Any:
    return engine._grammar_state(Grammar("json_schema", schema))


def _accept_text(engine: TorchEngine, tok: Any, state: Any, text: str) -> list[int]:
    ids = list(tok.encode(text, add_special_tokens=False))
    for t in ids:
        assert state.accept(t), f"the grammar rejects {tok.decode([t])!r} of {text!r}"
    return ids


def test_a_tree_branches_over_a_numbers_digits_and_nowhere_else(engines: Any, tok: Any) -> None:
    from ssr_server.engine.torch.speculate import chains

    _, drafting = engines
    spell = drafting.scheduler.decoder
    state = _state(drafting, NUMBERS)
    fed = _accept_text(drafting, tok, state, '{"bbox_2d": [12')
    tree = chains(state, TokenHistory(fed), [], CFG, depth=20, rows=32, vocab_size=drafting.runner.vocab_size,
                  spell=spell)
    firsts = sorted(tok.decode([c[0]]) for c in tree)
    assert set("0123456789,") <= set(firsts) and len(tree) == len({c[0] for c in tree}) <= CFG.branches
    # too little room for every branch: a linear draft (or none), never part of a tree
    assert len(chains(state, TokenHistory(fed), [], CFG, depth=20, rows=5,
                      vocab_size=drafting.runner.vocab_size, spell=spell)) <= 1
    # branches off: linear only
    assert len(chains(state, TokenHistory(fed), [], DraftConfig(max_tokens=8, branches=0), depth=20, rows=32,
                      vocab_size=drafting.runner.vocab_size, spell=spell)) <= 1
    # where the grammar forces text (after a number's last possible digit: ", "), no tree
    forced_state = _state(drafting, NUMBERS)
    _accept_text(drafting, tok, forced_state, '{"bbox_2d": [1000')
    line = chains(forced_state, TokenHistory([]), [], CFG, depth=20, rows=32,
                  vocab_size=drafting.runner.vocab_size, spell=spell)
    assert len(line) == 1 and tok.decode(line[0]).startswith(",")
    # free text (a label's characters): far more than ``branches`` tokens admitted, no tree
    text_state = _state(drafting, NUMBERS)
    _accept_text(drafting, tok, text_state, '{"bbox_2d": [1, 2, 3, 4], "label": "a')
    assert len(chains(text_state, TokenHistory([]), [], CFG, depth=20, rows=64,
                      vocab_size=drafting.runner.vocab_size, spell=spell)) <= 1


def test_the_lookups_guess_goes_deeper_along_its_own_branch(engines: Any, tok: Any) -> None:
    from ssr_server.engine.torch.speculate import chains

    _, drafting = engines
    state = _state(drafting, NUMBERS)
    fed = _accept_text(drafting, tok, state, '{"bbox_2d": [2')
    # the context holds "[25, 7": after "[2" the lookup guesses "5, 7"; the branch of "5" carries it
    history = TokenHistory(list(tok.encode("box [25, 7", add_special_tokens=False)) + fed)
    tree = chains(state, history, [], CFG, depth=20, rows=32, vocab_size=drafting.runner.vocab_size,
                  spell=drafting.scheduler.decoder)
    deep = [c for c in tree if len(c) > 1]
    assert len(deep) == 1 and tok.decode(deep[0]).startswith("5")
    assert sum(len(c) for c in tree) <= 32


TREE_CASES: list[tuple[str, GenerationParams]] = [
    ("greedy", GenerationParams(max_new_tokens=60, grammar=Grammar("json_schema", NUMBERS))),
    ("seeded sampling", GenerationParams(max_new_tokens=60, temperature=1.1, seed=11,
                                         grammar=Grammar("json_schema", NUMBERS))),
    ("budget cut", GenerationParams(max_new_tokens=16, grammar=Grammar("json_schema", NUMBERS))),
]


@pytest.mark.parametrize("name,params", TREE_CASES, ids=[c[0] for c in TREE_CASES])
def test_tree_drafts_write_what_one_token_per_forward_writes(engines: Any, tok: Any, name: str,
                                                             params: GenerationParams) -> None:
    """Numbers the context cannot supply: each tree step keeps the branch the model picks (its keys
    moved up to follow the fed token when it was not the first branch), so later tokens see the right
    past; the text is the one-token-per-forward text, greedy or seeded, in fewer forwards."""
    plain, drafting = engines
    contexts = [_ctx(tok, f"Zoom on box {i}: ") for i in range(4)]

    async def run(engine: TorchEngine) -> list[Generation]:
        return [await engine.generate(c, params) for c in contexts]

    off, on = asyncio.run(run(plain)), asyncio.run(run(drafting))
    for a, b in zip(off, on, strict=True):
        _same(a, b)
    assert sum(b.timings["trees"] for b in on) > 0
    if name != "budget cut":
        assert sum(b.forwards for b in on) < sum(a.forwards for a in off)


def test_a_tree_step_keeps_the_keys_of_the_branch_it_keeps(engines: Any, tok: Any) -> None:
    """After tree steps, the generation's KV (cached for the next turn) holds the keys of the tokens it
    wrote, position by position, as a plain prefill of the same tokens computes them: the kept branch
    moved up right after the fed token, not whichever branch happened to lie there."""
    plain, drafting = engines
    drafting.prefix_cache.clear()
    ctx = _ctx(tok, "Zoom on box 3: ")
    params = GenerationParams(max_new_tokens=60, grammar=Grammar("json_schema", NUMBERS))
    gen = asyncio.run(drafting.generate(ctx, params))
    assert gen.timings["trees"] >= 2
    longest = max((e for e in drafting.prefix_cache._entries.values()), key=lambda e: len(e.key))
    assert longest.key[: len(ctx)] == ctx.token_ids and len(longest.key) > len(ctx) + 12
    plain.prefix_cache.clear()  # a plain prefill of the same tokens, not what plain has cached
    ref = plain.runner.prepare(Context(longest.key))
    plain.runner.prefill([ref], insert=False)
    assert ref.kv is not None
    n = len(longest.key)
    for layer in range(plain.runner.num_layers):
        for got, want in ((longest.kv.keys[layer], ref.kv.keys[layer]), (longest.kv.values[layer],
                                                                         ref.kv.values[layer])):
            assert torch.allclose(got[:, :, :n], want[:, :, :n], atol=1e-4), f"layer {layer}"
