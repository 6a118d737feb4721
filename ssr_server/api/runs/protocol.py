"""The stored runs' responses (pydantic, the HTTP edge); inside, the store's dataclasses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ssr_server.store.records import ImageInfo, RunSummary, StoredRun

RunStatus = Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"]


class RunSummaryOut(BaseModel):
    id: str
    object: Literal["agent.run"] = "agent.run"
    status: RunStatus
    mode: str
    library: str
    question: str
    outcome: str | None = Field(description="the agent's outcome once finished (answered, max_turns, ...)")
    answer: str | None
    error: str | None
    background: bool
    created_at: float = Field(description="unix seconds")
    started_at: float | None
    finished_at: float | None
    total_s: float | None
    model_s: float | None
    tool_s: float | None
    turn_count: int = Field(description="turns finished so far")
    image_count: int


class ImageOut(BaseModel):
    n: int
    url: str = Field(description="the image's bytes (GET, same auth)")
    media_type: str
    width: int
    height: int
    source: Literal["input", "zoom"]
    parent: int | None = Field(description="zoom: the image it was cut from")
    box: tuple[int, int, int, int] | None = Field(description="zoom: the box on the parent, 0..1000")


class StoredRunOut(RunSummaryOut):
    options: dict[str, Any]
    usage: dict[str, int]
    turns: list[dict[str, Any]] = Field(
        description="the turns so far, each as in POST /v1/agent/runs (index, candidate_id, scores, q, "
                    "action, observation, timings, ...)")
    images: list[ImageOut]


class RunPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[RunSummaryOut]
    has_more: bool
    next_after: str | None = Field(description="pass as `after` for the next page")


class RunAccepted(BaseModel):
    """The answer to a background run (202): fetch it later by id."""

    id: str
    object: Literal["agent.run"] = "agent.run"
    status: RunStatus
    url: str


def summary_out(s: RunSummary) -> RunSummaryOut:
    return RunSummaryOut(
        id=s.id, status=s.status, mode=s.mode, library=s.library, question=s.question, outcome=s.outcome,
        answer=s.answer, error=s.error, background=s.background, created_at=s.created_at,
        started_at=s.started_at, finished_at=s.finished_at, total_s=s.total_s, model_s=s.model_s,
        tool_s=s.tool_s, turn_count=s.turns, image_count=s.images)


def image_out(run_id: str, i: ImageInfo) -> ImageOut:
    source: Literal["input", "zoom"] = "zoom" if i.source == "zoom" else "input"
    return ImageOut(n=i.n, url=f"/v1/agent/runs/{run_id}/images/{i.n}", media_type=i.media_type,
                    width=i.width, height=i.height, source=source, parent=i.parent, box=i.box)


def stored_out(r: StoredRun) -> StoredRunOut:
    return StoredRunOut(**summary_out(r.summary).model_dump(), options=r.options, usage=r.usage,
                        turns=r.turns, images=[image_out(r.summary.id, i) for i in r.images])
