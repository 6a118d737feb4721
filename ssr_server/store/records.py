"""What the run store holds, as the server sees it: dataclasses, no database types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ssr_server.core.errors import InvalidRequest

Status = Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"]
STATUSES: tuple[Status, ...] = ("queued", "running", "completed", "failed", "cancelled", "interrupted")
ACTIVE: tuple[Status, ...] = ("queued", "running")  # a run whose process may still be working on it
INTERRUPTED = "the server stopped before the run finished (crash, restart or shutdown)"


def status_of(outcome: str) -> Status:
    """A finished run's status from the agent's outcome: a run that ended by one of its limits (turns,
    context, deadline) completed; an error failed; a cancellation is its own status."""
    if outcome == "error":
        return "failed"
    if outcome == "cancelled":
        return "cancelled"
    return "completed"


class RunNotFound(InvalidRequest):
    status_code = 404
    code = "run_not_found"


class RunConflict(InvalidRequest):
    """The run is not in a state the request needs (cancel a finished run, delete a running one)."""

    status_code = 409
    code = "run_conflict"


@dataclass(frozen=True)
class NewRun:
    id: str
    question: str
    mode: str
    library: str
    options: dict[str, Any]  # the request's run options (mode, tau, alpha, seed, max_turns, ...)
    background: bool = False


@dataclass(frozen=True)
class ImageBlob:
    """An image as stored: encoded bytes (bounded), its size, and where it came from."""

    data: bytes
    media_type: str
    width: int
    height: int
    source: str = "input"  # input | zoom
    parent: int | None = None  # zoom: the image it was cropped from
    box: tuple[int, int, int, int] | None = None  # zoom: the box on the parent (0..1000 each way)


@dataclass(frozen=True)
class ImageInfo:
    n: int
    media_type: str
    width: int
    height: int
    source: str
    parent: int | None
    box: tuple[int, int, int, int] | None


@dataclass
class RunSummary:
    id: str
    status: Status
    mode: str
    library: str
    question: str
    outcome: str | None
    answer: str | None
    error: str | None
    background: bool
    created_at: float  # unix seconds
    started_at: float | None
    finished_at: float | None
    total_s: float | None
    model_s: float | None
    tool_s: float | None
    turns: int
    images: int


@dataclass
class StoredRun:
    summary: RunSummary
    options: dict[str, Any]
    usage: dict[str, int]
    turns: list[dict[str, Any]]  # agent.trace.Turn.to_dict(), in order
    images: list[ImageInfo] = field(default_factory=list)


@dataclass(frozen=True)
class RunFilter:
    status: Status | None = None
    mode: str | None = None
    outcome: str | None = None
    since: float | None = None  # created at or after (unix seconds)
    until: float | None = None  # created before


@dataclass
class Page:
    runs: list[RunSummary]
    has_more: bool


class StoreOff(InvalidRequest):
    status_code = 404
    code = "run_store_off"


class StoreUnavailable(InvalidRequest):
    """The store could not take a write that the request cannot do without (a background run)."""

    status_code = 503
    code = "run_store_unavailable"
