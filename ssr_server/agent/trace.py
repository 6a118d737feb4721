"""What a run records: one Turn per step and the Run around them, with their timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["answered", "max_turns", "error", "cancelled", "timeout", "context_limit"]


@dataclass
class Turn:
    index: int
    mode: str
    candidate_id: str | None = None  # ssr: the chosen rationale
    reasoning: str = ""  # the rationale pasted (ssr) or decoded (freeform)
    scores: list[float] | None = None  # S_i per candidate scored (ssr), library order
    q: list[float] | None = None  # selection probabilities (ssr)
    # ssr: candidates not scored this turn, by id, and why (a move that needs an image in a run without
    # one; on the OpenAI route also a move the request does not allow). scores and q skip them.
    left_out: dict[str, str] = field(default_factory=dict)
    action_type: str | None = None  # image_search | text_search | zoom | answer
    tool_name: str | None = None  # the tool as the format names it (e.g. text_search_tool)
    argument: str = ""  # the answer, or the decoded arguments as JSON text
    arguments: dict[str, Any] | None = None  # a tool call's decoded arguments
    action_text: str = ""  # the action as it stands in the context, tags included
    observation: str = ""  # what the model read back (the format's text, placeholders included)
    tool_data: dict[str, Any] | None = None  # the tool's structured result (hits, boxes, ...)
    # [start, end) in the run's context (compact token ids) of the reasoning the model chose or decoded,
    # and of the action tokens it decoded (forced openings and closings excluded): what RL trains on
    reasoning_span: tuple[int, int] | None = None
    action_span: tuple[int, int] | None = None
    observation_ok: bool = True
    error: str | None = None  # why the action or tool failed, if it did
    context_tokens: int = 0  # context length when the turn started
    cached_tokens: int = 0  # of those, found in the engine's cache
    scored_tokens: int = 0
    reasoning_tokens: int = 0
    action_tokens: int = 0
    action_forwards: int = 0  # decode forwards the action took (fewer than its tokens with drafts)
    reasoning_s: float = 0.0
    action_s: float = 0.0
    tool_s: float = 0.0
    turn_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Run:
    id: str
    question: str
    mode: str
    library: str
    outcome: Outcome = "error"
    answer: str | None = None
    error: str | None = None
    turns: list[Turn] = field(default_factory=list)
    total_s: float = 0.0
    model_s: float = 0.0  # reasoning + action time: the paper's per-question latency measure
    tool_s: float = 0.0
    prompt_tokens: int = 0  # final context length
    scored_tokens: int = 0
    generated_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
