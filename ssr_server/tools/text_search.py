"""Text search: a backend protocol, a local BM25 backend, a SearxNG backend, and the tool itself.

The local backend makes the demo and the tests run offline; SearxNG is the self-hostable metasearch
engine whose JSON API (``GET /search?q=...&format=json`` -> ``{"results": [{"title", "url", "content",
"score"?}]}``) fronts real web search. The ``json`` format must be enabled in SearxNG's settings.yml
(``search.formats``), otherwise it answers 403.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import bm25s
import httpx

from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.tools.base import Observation, SearchHit, ToolContext
from ssr_server.tools.common import BackendTool, check_status, clip, http_error

MAX_QUERY_CHARS = 500


@dataclass(frozen=True)
class Hit:
    """One text search result; ``score`` is backend-specific, higher is better."""

    title: str
    text: str
    url: str
    score: float


class TextSearchBackend(Protocol):
    async def search(self, query: str, k: int) -> list[Hit]: ...


_STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "has", "have",
    "how", "in", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "were", "what",
    "when", "where", "which", "who", "whom", "why", "will", "with",
))
_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Lowercase words minus stopwords, with plural 's' stripped so "metres" meets "metre".

    bm25s's own tokenizer assigns ids per call, which breaks when queries are tokenized separately
    from the corpus; plain string tokens avoid that and need no stemmer package.
    """
    out = []
    for tok in _TOKEN.findall(text.lower()):
        if tok in _STOPWORDS or (len(tok) < 2 and not tok.isdigit()):
            continue
        if len(tok) > 4 and tok.endswith("s") and not tok.endswith("ss"):
            tok = tok[:-1]
        out.append(tok)
    return out


class LocalBM25:
    """BM25 over an in-memory list of documents (title and text both count), built once at load."""

    def __init__(self, documents: Iterable[Mapping[str, str]]) -> None:
        self._docs = [Hit(str(d["title"]), str(d["text"]), str(d.get("url", "")), 0.0) for d in documents]
        if not self._docs:
            raise ValueError("the text corpus is empty")
        self._index = bm25s.BM25()
        self._index.index([tokenize(f"{d.title} {d.text}") for d in self._docs], show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> LocalBM25:
        """Load ``{"title", "text", "url"?}`` lines; a bad line names the file and line number."""
        docs: list[dict[str, str]] = []
        with Path(path).open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
                if not isinstance(doc, dict) or not isinstance(doc.get("title"), str) or not isinstance(
                    doc.get("text"), str
                ):
                    raise ValueError(f"{path}:{lineno}: a document needs string 'title' and 'text'")
                docs.append(doc)
        return cls(docs)

    def __len__(self) -> int:
        return len(self._docs)

    def _search(self, query: str, k: int) -> list[Hit]:
        tokens = tokenize(query)
        if not tokens or k <= 0:
            return []
        ids, scores = self._index.retrieve([tokens], k=min(k, len(self._docs)), show_progress=False)
        hits = []
        for i, s in zip(ids[0], scores[0], strict=True):
            if float(s) > 0.0:  # zero means no query term occurs: not a match
                d = self._docs[int(i)]
                hits.append(Hit(d.title, d.text, d.url, round(float(s), 4)))
        return hits

    async def search(self, query: str, k: int) -> list[Hit]:
        return await asyncio.to_thread(self._search, query, k)


class SearxNGBackend:
    """Queries a SearxNG instance through its JSON API.

    Pass ``client`` to share a connection pool; otherwise one is created on first use and closed by
    ``aclose``. ``params`` adds query parameters such as ``{"engines": "wikipedia", "language": "en"}``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.params = dict(params or {})
        self._client = client
        self._owns_client = client is None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers={"Accept": "application/json"})
        return self._client

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def search(self, query: str, k: int) -> list[Hit]:
        params = {**self.params, "q": query, "format": "json"}
        try:
            r = await self._get_client().get(f"{self.base_url}/search", params=params, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise http_error("SearxNG", e, self.timeout_s) from e
        if r.status_code == 403:
            raise ToolError("SearxNG refused the JSON API (HTTP 403); enable 'json' in search.formats")
        check_status("SearxNG", r)
        try:
            payload: Any = r.json()
        except ValueError:
            raise ToolError("SearxNG returned a response that is not JSON") from None
        results = payload.get("results") if isinstance(payload, dict) else None
        if not isinstance(results, list):
            raise ToolError("SearxNG returned JSON without a 'results' list")
        hits = []
        for rank, item in enumerate(results):
            if not isinstance(item, dict) or not isinstance(item.get("title"), str):
                continue  # skip malformed entries rather than losing the good ones
            content, url, score = item.get("content"), item.get("url"), item.get("score")
            hits.append(Hit(
                title=item["title"],
                text=content if isinstance(content, str) else "",
                url=url if isinstance(url, str) else "",
                score=float(score) if isinstance(score, int | float) else 1.0 / (rank + 1),
            ))
            if len(hits) >= k:
                break
        return hits


class TextSearchTool(BackendTool):
    """Runs ``call.query`` through a backend: the top hits (title, URL, snippet cut to ``max_chars``)."""

    name = "text_search"

    backend: TextSearchBackend

    def __init__(self, backend: TextSearchBackend, *, k: int = 5, max_chars: int = 400) -> None:
        super().__init__(backend, k=k, max_chars=max_chars)

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        query = " ".join(call.query.split())[:MAX_QUERY_CHARS]
        if not query:
            raise ToolError("text_search needs a non-empty query")
        hits = await self.backend.search(query, self.k)
        data: dict[str, object] = {"query": query, "hits": [asdict(h) for h in hits]}
        return Observation(hits=tuple(SearchHit(h.title, h.url, clip(h.text, self.max_chars), h.score)
                                      for h in hits), data=data)
