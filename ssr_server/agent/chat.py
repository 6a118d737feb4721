"""The one chat renderer: messages, questions and observations to token ids, through the prompt format.

Every place that builds a context uses it: the agent loop (``start``, ``observation``), the selection
route and the OpenAI route (``render``, on their ``PendingMessage``s once the images are fetched).
Everything a client wrote is escaped here, with the one ``Escaper``: the question, every message's text,
an assistant turn's reasoning and tool calls (name and arguments), the client's tool definitions (every
string of them: names, descriptions, property names, enums, defaults), and candidate texts, in the
system prompt's strategy list and in the surfaces scored (``candidate_surfaces``). The format's own text
never is. Images are written as the format's placeholders (``[IMAGE n]``,
one-based over the run's image registry) and each placeholder becomes the format's vision marker, whose
single ``<|image_pad|>`` the engines expand (the compact ``Context``). Contexts grow by appending
tokens, never by re-tokenising, so turn t+1's context is turn t's plus new tokens and the prefix cache
reuses everything before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ssr_server.agent.escape import Escaper
from ssr_server.core.errors import InvalidRequest
from ssr_server.core.formats.format import PromptFormat
from ssr_server.core.library import Library
from ssr_server.core.protocol import Context, ImageRef

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCallRecord:
    name: str  # the tool's name as advertised (e.g. text_search_tool)
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Message:
    """One chat message. ``content`` holds text pieces (external text: escaped when rendered) and
    images in order; an assistant message may also carry the reasoning it pasted and its tool call."""

    role: Role
    content: tuple[str | ImageRef, ...] = ()
    reasoning: str | None = None
    tool_calls: tuple[ToolCallRecord, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class PendingMessage:
    """A message as a request states it, before its images are fetched: each image is the index of its
    source in the request's list. The HTTP routes check a request's limits and take an admission slot
    before any image I/O, so their messages wait in this form until the images are in."""

    role: Role
    content: tuple[str | int, ...] = ()

    def texts(self) -> list[str]:
        return [p for p in self.content if isinstance(p, str)]

    def with_images(self, images: Sequence[ImageRef]) -> Message:
        return Message(self.role, tuple(images[p] if isinstance(p, int) else p for p in self.content))


class ChatRenderer:
    def __init__(self, tokenizer: Any, fmt: PromptFormat) -> None:
        self.tokenizer = tokenizer
        self.format = fmt
        self.escape = Escaper.for_tokenizer(tokenizer, fmt.escapes)
        before, _, after = fmt.placeholder.partition("{number}")
        self._placeholder = re.compile(re.escape(before) + r"(\d+)" + re.escape(after))

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def system_prompt(self, library: Library) -> str:
        """The format's system prompt for ``library``, its candidate texts escaped (a client may send
        them: ``candidates``)."""
        return self.format.system_prompt(library, self.escape)

    def candidate_surfaces(self, library: Library, label_only: bool = False) -> tuple[str, ...]:
        """What is scored for each candidate, and pasted when chosen: its text escaped, as the system
        prompt lists it."""
        return self.format.candidate_surfaces(library, label_only, self.escape)

    def tool_name(self, name: str) -> str:
        """A client's tool name as the prompt shows it (the call returned to the client keeps its own)."""
        return self.escape(name)

    def encode_with_images(self, text: str, images: Sequence[ImageRef], first_number: int) -> tuple[int, ...]:
        """Tokens of ``text`` whose placeholders, numbered from ``first_number``, name ``images``."""
        numbers = [int(m.group(1)) for m in self._placeholder.finditer(text)]
        expected = list(range(first_number, first_number + len(images)))
        if numbers != expected:
            raise ValueError(f"placeholders {numbers} do not match images {expected}")
        return self.encode(self._placeholder.sub(lambda _: self.format.vision_marker, text))

    # ---- the agent loop ----------------------------------------------------------------------
    def start(self, question: str, images: Sequence[ImageRef], library: Library) -> Context:
        """System prompt (strategies for ``library``), the question with its images, the assistant turn."""
        user = self.format.user_content(self.escape(question), 1, len(images))
        text = (self.format.message("system", self.system_prompt(library))
                + self.format.message("user", user) + self.format.assistant_start())
        return Context(self.encode_with_images(text, images, 1), tuple(images))

    def observation(self, text: str, new_images: Sequence[ImageRef], images_before: int) -> tuple[int, ...]:
        """Tokens closing the assistant turn, carrying ``text`` (already rendered by the format, external
        parts escaped; placeholders name ``new_images``), and opening the next assistant turn."""
        return self.encode_with_images(self.format.observation_turn(text), new_images, images_before + 1)

    # ---- whole conversations (selection route, OpenAI route) -------------------------------------
    def render(self, messages: Sequence[Message], library: Library | None = None,
               add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None) -> Context:
        """A context from chat messages. A client's ``tools`` (OpenAI ``{"type": "function", ...}``
        entries) are advertised, escaped, in the format's tools section, which ends the system message
        after the client's own system text if any; otherwise, without a system message, the format's
        system prompt for ``library`` comes first (when a library is given)."""
        if not messages:
            raise InvalidRequest("messages must not be empty")
        parts: list[str] = []
        images: list[ImageRef] = []
        if tools is not None:
            block = self.format.client_tools_block(tools, self.escape)
            if messages[0].role == "system":
                block = self._content(messages[0].content, images) + "\n\n" + block
                messages = messages[1:]
            parts.append(self.format.message("system", block))
        elif messages[0].role != "system" and library is not None:
            parts.append(self.format.message("system", self.system_prompt(library)))
        for m in messages:
            parts.append(self._message(m, images))
        if add_generation_prompt:
            parts.append(self.format.assistant_start())
        return Context(self.encode_with_images("".join(parts), images, 1), tuple(images))

    def _content(self, content: Sequence[str | ImageRef], images: list[ImageRef], user: bool = False) -> str:
        """Text escaped, images as placeholders (in a user message, as the format writes a question's
        images: ``"\n[IMAGE n]"``, so that ``[text, image]`` renders exactly like the agent's question)."""
        out = []
        for piece in content:
            if isinstance(piece, ImageRef):
                images.append(piece)
                placeholder = self.format.image_placeholder(len(images))
                out.append(self.format.user.image.format(placeholder=placeholder) if user else placeholder)
            else:
                out.append(self.escape(piece))
        return "".join(out)

    def _message(self, m: Message, images: list[ImageRef]) -> str:
        fmt = self.format
        if m.role == "tool":
            body = fmt.tool_response.open + self._content(m.content, images) + fmt.tool_response.close
            return fmt.message("user", body)
        if m.role != "assistant":  # a client's system message is external text too
            return fmt.message(m.role, self._content(m.content, images, user=m.role == "user"))
        text = fmt.reasoning.candidate.format(text=self.escape(m.reasoning)) if m.reasoning else ""
        for call in m.tool_calls:
            # The arguments are the client's to send back, whatever the model decoded: escaped too.
            action = fmt.tool_action(call.name)
            if action is not None:
                text += fmt.tool_call_text(action, call.arguments, self.escape)
            else:  # a tool the format does not know (OpenAI clients): the same Qwen-style call
                body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False)
                text += fmt.actions.tool_call.open + self.escape(body) + fmt.actions.tool_call.close
        answer = self._content(m.content, images)
        if answer and not m.tool_calls:
            text += fmt.actions.answer.open + answer + fmt.actions.answer.close
        return fmt.message("assistant", text)
