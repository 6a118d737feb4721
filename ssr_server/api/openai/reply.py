"""The OpenAI-shaped reply: one whole ``chat.completion``, or its ``chat.completion.chunk`` stream, with
the selection's details in an extra ``ssr`` field (OpenAI clients keep unknown fields).

The reasoning goes out as ``reasoning_content``, the field SGLang and vLLM use, so clients that show a
reasoning model's thinking show the selected rationale.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ssr_server.agent.completion import Completion
from ssr_server.api.errors import error_payload, openai_error

DONE = "data: [DONE]\n\n"


class Reply:
    """One reply's ids and time, fixed before the work starts, so that every chunk of a stream (and the
    tool call's id, which ``ReasoningMemory`` keys on) names the same completion."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.call_id = "call_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _usage(self, c: Completion) -> dict[str, Any]:
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": c.reasoning_tokens}}

    def _ssr(self, c: Completion) -> dict[str, Any]:
        t = c.turn
        return {"candidate_id": c.candidate_id, "scores": t.scores, "q": t.q, "left_out": t.left_out,
                "reasoning_s": t.reasoning_s, "action_s": t.action_s, "error": t.error}

    def _calls(self, c: Completion) -> list[dict[str, Any]]:
        return [{"id": self.call_id, "type": "function",
                 "function": {"name": c.tool_name, "arguments": c.arguments or ""}}]

    def whole(self, c: Completion) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c.content,
                                   "reasoning_content": c.reasoning}
        if c.tool_name is not None:
            message["tool_calls"] = self._calls(c)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason,
                             "logprobs": None}],
                "usage": self._usage(c), "ssr": self._ssr(c)}

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        """One server-sent event; with ``include_usage`` every chunk but the last carries ``usage: null``,
        as OpenAI sends them."""
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                "model": self.model,
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                             "logprobs": None}]}
        if self.include_usage:
            body["usage"] = None
        body.update(extra)
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def final(self, c: Completion) -> list[str]:
        """The chunks after the reasoning. A tool call goes out as OpenAI streams one, its name and id
        first, then its arguments, so that clients that assemble calls from deltas assemble ours."""
        if c.tool_name is None:
            out = [self.chunk({"content": c.content or ""})]
        else:
            call = self._calls(c)[0]
            out = [self.chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                               "function": {"name": c.tool_name, "arguments": ""}}]}),
                   self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": c.arguments or ""}}]})]
        out.append(self.chunk({}, c.finish_reason, ssr=self._ssr(c)))
        if self.include_usage:
            body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": [], "usage": self._usage(c)}
            out.append(f"data: {json.dumps(body)}\n\n")
        return out

    @staticmethod
    def error(exc: BaseException) -> str:
        """An error after the stream began (its status is sent): the chunk the openai client raises on."""
        status, payload = error_payload(exc)
        return f"data: {json.dumps({'error': openai_error(status, payload)})}\n\n"
