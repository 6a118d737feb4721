"""What a load run records: one ``RequestRecord`` per request sent, and the ``LoadResult`` around them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Fate = Literal["completed", "failed", "refused"]


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds relative to the start of the load."""

    index: int
    mode: str
    with_image: bool
    question: str
    fate: Fate
    status: int | None = None  # HTTP status; None when no response came (transport error, timeout)
    outcome: str | None = None  # the run's outcome when completed
    scheduled_s: float = 0.0  # when it was due (open loop) or taken (closed loop)
    start_s: float = 0.0  # when it was sent
    end_s: float = 0.0  # when its response (or its error) arrived
    latency_s: float = 0.0  # end - start: what the server took, as the client saw it
    sched_latency_s: float = 0.0  # end - scheduled: includes any wait for the in-flight cap
    first_turn_s: float | None = None  # streaming only: start -> first ``turn`` event
    turns: int = 0
    reasoning_s: list[float] = field(default_factory=list)  # per turn, as the server measured it
    model_s: float | None = None
    tool_s: float | None = None
    server_total_s: float | None = None
    retry_after_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadResult:
    target: str
    loop: Literal["open", "closed"]
    config: dict[str, Any]
    records: list[RequestRecord]
    started_at: float  # wall clock (time.time()) at the start
    elapsed_s: float  # start -> last request settled
    launch_window_s: float  # start -> last launch
    cap_waits: int = 0  # open loop: launches held back by the in-flight cap
    cancelled_at_end: int = 0  # still in flight after the final wait, cancelled (counted as failed)

    @property
    def sent(self) -> int:
        return len(self.records)

    def count(self, fate: Fate) -> int:
        return sum(1 for r in self.records if r.fate == fate)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "loop": self.loop, "config": self.config,
                "started_at": self.started_at, "elapsed_s": self.elapsed_s,
                "launch_window_s": self.launch_window_s, "cap_waits": self.cap_waits,
                "cancelled_at_end": self.cancelled_at_end, "records": [r.to_dict() for r in self.records]}
