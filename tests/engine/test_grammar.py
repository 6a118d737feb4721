"""Grammar-constrained decoding: every sampled output of the random tiny model is in the language (JSON
schema, EBNF, regex), the generation ends as soon as the text is complete (no end token returned),
greedy is deterministic, constrained and free generations share forwards, bad grammars are refused."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import pytest

from ssr_server.core.errors import InvalidRequest
from ssr_server.core.protocol import Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel

# The agent's text-search call: the string is narrowed so that what the grammar admits is exactly what
# a strict json.loads accepts (no control characters) and no tag can open inside it.
QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "pattern": '^[^<\\\\"\\x00-\\x1f]{1,40}$'}},
    "required": ["query"], "additionalProperties": False,
}
JSON_GRAMMAR = Grammar("json_schema", json.dumps(QUERY_SCHEMA))
EBNF = 'root ::= "answer: " ("yes" | "no" | "maybe " [0-9] [0-9]?) "."'
EBNF_RE = re.compile(r"answer: (yes|no|maybe [0-9][0-9]?)\.")
REGEX = r"box\([0-9]{1,3}, [0-9]{1,3}\)"


def sampled(seed: int, grammar: Grammar, n: int = 96) -> GenerationParams:
    return GenerationParams(max_new_tokens=n, temperature=1.0, seed=seed, grammar=grammar)


def assert_complete(g: Generation, engine: TorchEngine) -> None:
    """Finished by the grammar: reason stop, no stop string, no end token, text = the tokens' text."""
    assert g.finish_reason == "stop" and g.stop_text is None, g
    assert not set(g.token_ids) & engine.lm.eos_token_ids
    assert g.text == engine.tokenizer.decode(list(g.token_ids), skip_special_tokens=False)


async def test_sampled_json_always_parses_and_validates(engine: TorchEngine,
                                                        contexts: dict[str, Context]) -> None:
    ctx = contexts["text"]
    outs = await asyncio.gather(*(engine.generate(ctx, sampled(seed, JSON_GRAMMAR)) for seed in range(24)))
    for g in outs:
        assert_complete(g, engine)
        value = json.loads(g.text)  # strict: control characters would raise
        jsonschema.validate(value, QUERY_SCHEMA)
        assert g.text == json.dumps(value, separators=(",", ":"), ensure_ascii=False) or \
            g.text == json.dumps(value, ensure_ascii=False)  # canonical whitespace, no padding
    assert len({g.text for g in outs}) > 12  # sampling still samples


@pytest.mark.parametrize(("grammar", "check"), [
    (Grammar("ebnf", EBNF), EBNF_RE.fullmatch),
    (Grammar("regex", REGEX), re.compile(REGEX).fullmatch),
])
async def test_sampled_ebnf_and_regex(grammar: Grammar, check: Any, engine: TorchEngine,
                                      contexts: dict[str, Context]) -> None:
    ctx = contexts["image"]
    outs = await asyncio.gather(*(engine.generate(ctx, sampled(seed, grammar, 32)) for seed in range(16)))
    for g in outs:
        assert_complete(g, engine)
        assert check(g.text), g.text
    assert len({g.text for g in outs}) > 1


async def test_greedy_under_a_grammar_is_deterministic(lm: LoadedModel, contexts: dict[str, Context]) -> None:
    params = GenerationParams(max_new_tokens=96, grammar=JSON_GRAMMAR)
    a, b = TorchEngine(lm), TorchEngine(lm)
    try:
        first = await a.generate(contexts["two_images"], params)
        again = await a.generate(contexts["two_images"], params)  # now from the prefix cache
        other = await b.generate(contexts["two_images"], params)
    finally:
        a.scheduler.close()
        b.scheduler.close()
    assert first.token_ids == again.token_ids == other.token_ids
    assert_complete(first, a)
    jsonschema.validate(json.loads(first.text), QUERY_SCHEMA)


async def test_length_limit_inside_a_grammar(engine: TorchEngine, contexts: dict[str, Context]) -> None:
    g = await engine.generate(contexts["text"], GenerationParams(max_new_tokens=3, grammar=JSON_GRAMMAR))
    assert g.finish_reason == "length" and len(g.token_ids) == 3
    assert g.text.startswith("{")  # a prefix of the language


async def test_constrained_and_free_generations_share_forwards(lm: LoadedModel,
                                                               contexts: dict[str, Context]) -> None:
    """A grammar generation batched with unconstrained ones: each equals its result alone."""
    free = GenerationParams(max_new_tokens=12)
    constrained = GenerationParams(max_new_tokens=96, grammar=JSON_GRAMMAR)
    jobs = [(contexts["text"], free), (contexts["image"], constrained), (contexts["two_images"], free),
            (contexts["text"], GenerationParams(max_new_tokens=32, grammar=Grammar("regex", REGEX)))]
    together, alone = TorchEngine(lm), TorchEngine(lm)
    try:
        batched = await asyncio.gather(*(together.generate(c, p) for c, p in jobs))
        single = [await alone.generate(c, p) for c, p in jobs]
        assert together.stats()["max_batch"] > 1
    finally:
        together.scheduler.close()
        alone.scheduler.close()
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    assert batched[0].finish_reason in ("length", "eos")
    assert_complete(batched[1], together)
    assert re.fullmatch(REGEX, batched[3].text)


@pytest.mark.parametrize("grammar", [
    Grammar("json_schema", "{not json"),
    Grammar("json_schema", '{"type": "no-such-type"}'),
    Grammar("ebnf", "root ::= "),
    Grammar("regex", "(unclosed"),
])
async def test_a_grammar_that_does_not_compile_is_invalid(grammar: Grammar, engine: TorchEngine,
                                                          contexts: dict[str, Context]) -> None:
    for _ in range(2):  # the failure is cached, and raised again
        with pytest.raises(InvalidRequest, match=r"JSON schema|EBNF grammar|regular expression") as caught:
            await engine.generate(contexts["text"], GenerationParams(max_new_tokens=4, grammar=grammar))
        # xgrammar's reason, without its log timestamp and source file ("[21:35:40] /project/cpp/...cc:94:")
        assert not re.search(r"\.cc:|\[\d\d:\d\d:\d\d\]", caught.value.message), caught.value.message
    g = await engine.generate(contexts["text"], GenerationParams(max_new_tokens=2))  # still serving
    assert len(g.token_ids) == 2


def test_compiled_grammars_are_cached(engine: TorchEngine) -> None:
    a = engine.grammars.compile(JSON_GRAMMAR)
    b = engine.grammars.compile(Grammar("json_schema", json.dumps(QUERY_SCHEMA)))
    assert a is b


@pytest.mark.parametrize("grammar", [JSON_GRAMMAR, Grammar("ebnf", EBNF), Grammar("regex", REGEX)])
def test_a_state_copied_from_its_grammars_start_is_a_fresh_one(engine: TorchEngine, grammar: Grammar) -> None:
    """Every state after a grammar's first starts from a copy of the first one's start mask: the same
    mask a fresh fill makes, and its own (advancing one state leaves the others as they were)."""
    from ssr_server.engine.torch.grammar import GrammarState

    compiled = engine.grammars.compile(grammar)
    first, second = engine.grammars.state(compiled), engine.grammars.state(compiled)
    fresh = GrammarState(compiled, engine.grammars.vocab_size, engine.grammars.stop_ids)
    for s in (first, second):
        assert s.need_apply == fresh.need_apply and s.bitmask.equal(fresh.bitmask)
    assert first.bitmask.data_ptr() != second.bitmask.data_ptr()
    allowed = [t for t in range(engine.grammars.vocab_size) if first.allows(t)]
    for s in (first, second):  # advanced, each on its own
        assert s.accept(allowed[0]) and not s.bitmask.equal(fresh.bitmask)
    third = engine.grammars.state(compiled)
    assert third.bitmask.equal(fresh.bitmask) and third.need_apply == fresh.need_apply
    assert [t for t in range(engine.grammars.vocab_size) if third.allows(t)] == allowed
