from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.tools.base import ToolContext
from ssr_server.tools.common import clip
from ssr_server.tools.demo import DemoWorld
from ssr_server.tools.text_search import (
    Hit,
    LocalBM25,
    SearxNGBackend,
    TextSearchTool,
    tokenize,
)

CTX = ToolContext(images=())


@pytest.fixture(scope="module")
def bm25(demo_assets: DemoWorld) -> LocalBM25:
    return LocalBM25.from_jsonl(demo_assets.corpus_path)


def test_tokenize_drops_stopwords_and_plural_s() -> None:
    assert tokenize("How tall is the Eiffel Tower, in metres?") == ["tall", "eiffel", "tower", "metre"]
    assert tokenize("a 7 b glass") == ["7", "glass"]


async def test_bm25_finds_the_gold_document_of_every_demo_question(bm25: LocalBM25,
                                                                   demo_assets: DemoWorld) -> None:
    """Every gold text-search query of the demo world returns its document in the top 5, best first."""
    moves = [m for q in demo_assets.questions() for m in q.moves if m["action"] == "text_search"]
    assert len(moves) > 50
    first = 0
    for m in moves:
        hits = await bm25.search(m["query"], 5)
        assert m["expect_url"] in [h.url for h in hits], m["query"]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        first += hits[0].url == m["expect_url"]
    assert first / len(moves) > 0.9  # near-namesakes and look-alike facts make a few not first


async def test_bm25_no_match_and_k(bm25: LocalBM25) -> None:
    assert await bm25.search("zzzyx qwertyuiop", 5) == []
    assert await bm25.search("the of what is", 5) == []
    assert len(await bm25.search("tower", 2)) == 2
    assert len(await bm25.search("tower", 0)) == 0
    assert len(await bm25.search("the tower", 1000)) <= len(bm25)


def test_bm25_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "a", "text": "b"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        LocalBM25.from_jsonl(bad)
    bad.write_text('{"title": "a"}\n')
    with pytest.raises(ValueError, match=r":1: a document needs"):
        LocalBM25.from_jsonl(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        LocalBM25.from_jsonl(empty)


async def test_tool_returns_the_top_hits(bm25: LocalBM25) -> None:
    obs = await TextSearchTool(bm25, k=3)(ToolCall("text_search", query="  Eiffel   Tower height "), CTX)
    assert obs.ok and len(obs.hits) == 3 and obs.images == ()
    assert obs.hits[0].title == "Eiffel Tower" and obs.hits[0].url.startswith("https://")
    assert obs.data["query"] == "Eiffel Tower height"  # whitespace folded
    hits = obs.data["hits"]
    assert isinstance(hits, list) and len(hits) == 3


async def test_tool_cuts_each_snippet_to_its_budget(bm25: LocalBM25, tmp_path: Path) -> None:
    long = LocalBM25([{"title": "Long", "text": "tower " * 200, "url": "u"}])
    obs = await TextSearchTool(long, k=1, max_chars=120)(ToolCall("text_search", query="tower"), CTX)
    assert len(obs.hits[0].text) == 120 and obs.hits[0].text.endswith("…")


def test_clip_folds_whitespace() -> None:
    assert clip("a \n b", 100) == "a b"
    assert clip("x" * 10, 5) == "xxxx…"


async def test_tool_empty_query_and_no_results(bm25: LocalBM25) -> None:
    with pytest.raises(ToolError, match="non-empty query"):
        await TextSearchTool(bm25)(ToolCall("text_search", query="   "), CTX)
    obs = await TextSearchTool(bm25)(ToolCall("text_search", query="zzzyx"), CTX)
    assert obs.ok and obs.hits == ()


async def test_searxng_backend_parses_the_json_api(
    live_server: str, searx_requests: list[dict[str, str]]
) -> None:
    backend = SearxNGBackend(f"{live_server}/searx", params={"engines": "wikipedia"})
    try:
        hits = await backend.search("Eiffel Tower tall metres", 2)
    finally:
        await backend.aclose()
    assert len(hits) == 2
    assert hits[0] == Hit("Eiffel Tower", hits[0].text, hits[0].url, hits[0].score)
    assert "330" in hits[0].text and hits[0].score >= hits[1].score
    sent = searx_requests[-1]
    assert sent["format"] == "json" and sent["engines"] == "wikipedia" and sent["q"].startswith("Eiffel")


async def test_searxng_backend_with_shared_client_and_tool(live_server: str) -> None:
    async with httpx.AsyncClient() as client:
        tool = TextSearchTool(SearxNGBackend(f"{live_server}/searx" + "/", client=client), k=2)
        obs = await tool(ToolCall("text_search", query="Eiffel Tower completed"), CTX)
        await tool.aclose()  # a shared client is the caller's to close
        assert not client.is_closed
    assert any("1889" in h.text for h in obs.hits)


async def test_searxng_skips_malformed_entries(live_server: str) -> None:
    hits = await SearxNGBackend(f"{live_server}/mixed").search("x", 5)
    assert hits == [Hit("Kept", "", "", 1 / 3)]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("broken", "HTTP 500"),
        ("forbidden", "403"),
        ("badjson", "not JSON"),
        ("noresults", "without a 'results' list"),
    ],
)
async def test_searxng_errors_become_tool_errors(live_server: str, prefix: str, message: str) -> None:
    backend = SearxNGBackend(f"{live_server}/{prefix}")
    with pytest.raises(ToolError, match=message):
        await backend.search("anything", 3)
    await backend.aclose()


async def test_searxng_timeout_and_unreachable(live_server: str, free_port_url: str) -> None:
    with pytest.raises(ToolError, match=r"did not answer within 0\.2 s"):  # the server would take 1.5 s
        await SearxNGBackend(f"{live_server}/slow", timeout_s=0.2).search("x", 3)
    with pytest.raises(ToolError, match="unreachable"):
        await SearxNGBackend(free_port_url).search("x", 3)
