"""The system prompt and the token-level rendering of a run's history.

The first prompt goes through the model's chat template; every later piece (chosen rationale,
forced action opening, decoded action, observation) is appended as tokens, never re-tokenised, so
turn t+1's context is turn t's context plus new tokens (what the prefix cache needs) and the
rationale sits in the context exactly as it was scored. The reasoning goes where a reasoning model
puts it: inside ``<think>...</think>`` at the start of the assistant turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ssr_server.engine.base import Context, ImageRef

SYSTEM_PROMPT = """You are a visual search assistant. You answer questions about images.
Each turn, think inside <think></think>, then take exactly one action:
<image_search></image_search>  search the web with the latest image (or an image number) to identify it
<text_search>query</text_search>  search the web for text
<zoom>[x1, y1, x2, y2]</zoom>  crop the latest image to a box in 0-1000 relative coordinates
<answer>text</answer>  give the final answer, short and exact
Tool results come back inside <tool_response></tool_response>."""

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
THINK_OPEN = "<think>\n"
THINK_CLOSE = "</think>\n\n"


_SPECIAL = re.compile(r"<\|[^|<>]{0,40}\|>|</?think>|</?tool_response>")


def sanitize(text: str) -> str:
    """Defuse chat-control tokens in user or tool text: a question holding ``<|image_pad|>`` or
    ``<|im_end|>`` must not be able to forge an image slot or end its own turn."""
    return _SPECIAL.sub(lambda m: m.group(0).replace("<", "‹").replace(">", "›"), text)


class PromptBuilder:
    def __init__(self, tokenizer: Any, system_prompt: str = SYSTEM_PROMPT) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def start(self, question: str, images: Sequence[ImageRef]) -> Context:
        content: list[dict[str, str]] = [{"type": "image"} for _ in images]
        content.append({"type": "text", "text": sanitize(question)})
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": content}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return Context(self.encode(text + THINK_OPEN), tuple(images))

    def observation(self, text: str, new_images: Sequence[ImageRef], first_new_index: int) -> tuple[int, ...]:
        """Tokens that close the assistant turn, carry the tool result, and open the next turn."""
        parts = ["<|im_end|>\n<|im_start|>user\n<tool_response>\n", sanitize(text.strip())]
        for i, _ in enumerate(new_images):
            parts.append(f"\nImage {first_new_index + i + 1}: {IMAGE_PLACEHOLDER}")
        parts.append("\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + THINK_OPEN)
        return self.encode("".join(parts))
