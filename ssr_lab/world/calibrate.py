"""Calibration against the real search tools: every question's gold moves must work.

* Image search: ``LocalImageIndex`` (the very class the tool serves) must list the pictured entity for
  the question image: within the first ``rank`` hits and under its distance cut-off. A view that fails
  is redrawn with the next attempt number (a new deterministic seed) until it passes.
* Text search: ``LocalBM25`` (the tool's backend) must return the gold document among the first ``k``
  hits for the gold query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ssr_server.tools.image_search import LocalImageIndex
from ssr_server.tools.text_search import Hit, LocalBM25


@dataclass(frozen=True)
class ImageCheck:
    rank: int  # 0-based position of the gold entry among all entries, nearest first
    distance: float
    listed: bool  # within the cut-off, so the tool shows it at that rank


def image_rank(dist: np.ndarray[Any, np.dtype[np.float64]], gold: int) -> int:
    """The gold entry's position in a stable ascending sort, without sorting."""
    dg = dist[gold]
    return int(np.count_nonzero(dist < dg) + np.count_nonzero(dist[:gold] == dg))


def check_view(index: LocalImageIndex, gold: int, phash: str, dhash: str) -> ImageCheck:
    dist = index.distance_array(phash, dhash)
    return ImageCheck(image_rank(dist, gold), float(dist[gold]), float(dist[gold]) <= index.max_distance)


def text_hits(bm25: LocalBM25, queries: Sequence[str], k: int) -> list[list[Hit]]:
    """The tool backend's answers to many queries, in order.

    The backend is async; its loop runs in a thread of its own, so that a build also works when called
    from code that already runs an event loop (a server building the demo world at start-up).
    """

    async def run() -> list[list[Hit]]:
        return [await bm25.search(q, k) for q in queries]

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
