"""What one request may bring, from the settings. Checked before admission and before any image is
fetched, so that an oversized request costs neither a slot nor any I/O; the REST and OpenAI routes
state each limit in the same words."""

from __future__ import annotations

from collections.abc import Sequence

from ssr_server.core.config import Settings
from ssr_server.core.errors import InvalidRequest, PayloadTooLarge


def check_question(s: Settings, question: str) -> None:
    if len(question) > s.max_question_chars:
        raise PayloadTooLarge(f"question is {len(question)} characters; the limit is {s.max_question_chars}")


def check_images(s: Settings, count: int) -> None:
    if count > s.max_images:
        raise PayloadTooLarge(f"{count} images; the limit is {s.max_images}")


def check_messages(s: Settings, count: int) -> None:
    if count > s.max_messages:
        raise PayloadTooLarge(f"{count} messages; the limit is {s.max_messages}")


def check_conversation(s: Settings, chars: int) -> None:
    if chars > s.max_conversation_chars:
        raise PayloadTooLarge(
            f"the messages hold {chars} characters; the limit is {s.max_conversation_chars}")


def check_candidates(s: Settings, candidates: Sequence[str] | None, name: str = "candidates") -> None:
    """``name`` is the field as the client wrote it (``ssr.candidates`` on the OpenAI route)."""
    if candidates is None:
        return
    if not 1 <= len(candidates) <= s.max_candidates:
        raise InvalidRequest(f"{name} must hold 1..{s.max_candidates} texts")
    if any(len(c) > s.max_candidate_chars for c in candidates):
        raise PayloadTooLarge(f"a candidate is longer than {s.max_candidate_chars} characters")


def check_turns(s: Settings, max_turns: int) -> None:
    # The schema allows up to the build's MAX_TURNS; an operator may allow fewer.
    if max_turns > s.max_turns:
        raise InvalidRequest(f"max_turns is {max_turns}; this server allows at most {s.max_turns}")
