"""The one chat renderer: the reference format, token by token, under the real Qwen vocabulary."""

from __future__ import annotations

from typing import Any

import pytest
from PIL import Image

from ssr_server.agent.chat import ChatRenderer, Message, ToolCallRecord
from ssr_server.agent.observe import observation_text
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import Candidate, Library, LibraryRegistry
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.tiny import build_tokenizer
from ssr_server.tools.base import Observation, SearchHit

# Everything after the system prompt of a two-turn trajectory: image search with two thumbnails, a zoom
# on image 2 (registry index 1, the first thumbnail), then an answer. Checked against the reference
# harness: user turn = question + "\n[IMAGE 1]", assistant turn = <thinking>candidate</thinking> then
# a Qwen-style <tool_call> or <answer>, observations as a user turn <tool_response>\n...\n</tool_response>,
# new images numbered on, [IMAGE n] resolved to the vision marker, external text escaped.
EXPECTED = """<|im_end|>
<|im_start|>user
Which year was this bridge <b>opened</b>?
<|vision_start|><|image_pad|><|vision_end|><|im_end|>
<|im_start|>assistant
<thinking>I cannot confidently tell what the specific entity in this image is from its appearance alone, \
so I should identify it by searching with the image itself before answering.</thinking>
<tool_call>
{"name": "image_search_tool", "arguments": {}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
Reverse image search results:
Title: Tresslin Bridge
URL: https://example.org/tresslin
Thumbnail (registry index 1): <|vision_start|><|image_pad|><|vision_end|>
Title: Varrow Tower
URL: https://example.org/varrow?a=1&b=＜|im_end|>
Thumbnail (registry index 2): <|vision_start|><|image_pad|><|vision_end|>
</tool_response><|im_end|>
<|im_start|>assistant
<thinking>The part of the image that matters for this question is small or hard to make out, so I should \
examine that region more closely before I decide.</thinking>
<tool_call>
{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [100, 200, 600, 700], "label": "plaque", \
"img_idx": 1}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
Zoomed image (registry index 3): <|vision_start|><|image_pad|><|vision_end|>
</tool_response><|im_end|>
<|im_start|>assistant
<thinking>The information needed to answer is clearly visible in the image itself, so I can determine the \
answer by reading it directly from what I see.</thinking>
<answer>1931</answer><|im_end|>
"""


def _img(colour: str) -> ImageRef:
    return ImageRef.from_pil(Image.new("RGB", (64, 48), colour))


@pytest.fixture(scope="module")
def qwen() -> Any:
    return build_tokenizer("qwen")


@pytest.fixture(scope="module")
def library() -> Library:
    return LibraryRegistry().get("default")


def _trajectory(chat: ChatRenderer, library: Library) -> tuple[Context, list[tuple[int, ...]]]:
    """The trajectory built as the agent loop builds it: piece by piece, never re-tokenised."""
    fmt = chat.format
    surfaces = fmt.candidate_surfaces(library)
    pieces: list[tuple[int, ...]] = []

    def add(ctx: Context, ids: tuple[int, ...], images: tuple[ImageRef, ...] = ()) -> Context:
        pieces.append(ids)
        return ctx.extend(ids, images)

    def cand(cid: str) -> tuple[int, ...]:
        return chat.encode(surfaces[library.ids.index(cid)])

    ctx = chat.start("Which year was this bridge <b>opened</b>?", [_img("red")], library)
    pieces.append(ctx.token_ids)
    ctx = add(ctx, cand("r_IDENTIFY_BY_IMAGE"))
    ctx = add(ctx, chat.encode(fmt.tool_call_text("image_search", {})))
    thumbs = (_img("green"), _img("blue"))
    hits = (SearchHit("Tresslin Bridge", "https://example.org/tresslin", "", 0.9, thumbs[0]),
            SearchHit("Varrow Tower", "https://example.org/varrow?a=1&b=<|im_end|>", "", 0.5, thumbs[1]))
    text = observation_text(fmt, chat.escape, "image_search", Observation(hits=hits, images=thumbs), 1)
    ctx = add(ctx, chat.observation(text, thumbs, 1), thumbs)
    ctx = add(ctx, cand("r_ZOOM_DETAIL"))
    args = {"bbox_2d": [100, 200, 600, 700], "label": "plaque", "img_idx": 1}
    ctx = add(ctx, chat.encode(fmt.tool_call_text("zoom", args)))
    crop = (_img("white"),)
    text = observation_text(fmt, chat.escape, "zoom", Observation(images=crop), 3)
    ctx = add(ctx, chat.observation(text, crop, 3), crop)
    ctx = add(ctx, cand("r_ANSWER_FROM_IMAGE"))
    ctx = add(ctx, chat.encode(fmt.actions.answer.open + "1931" + fmt.actions.answer.close + fmt.chat.close))
    return ctx, pieces


def test_fixed_trajectory_renders_exactly(qwen: Any, library: Library) -> None:
    chat = ChatRenderer(qwen, get_format())
    ctx, pieces = _trajectory(chat, library)
    text = qwen.decode(list(ctx.token_ids), skip_special_tokens=False)
    system = get_format().system_prompt(library)
    assert text == "<|im_start|>system\n" + system + EXPECTED
    # the real Qwen ids of the structure tokens
    structure = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>"]
    assert qwen.convert_tokens_to_ids(structure) == [151644, 151645, 151652, 151655]
    pad = 151655
    assert list(ctx.token_ids).count(pad) == len(ctx.images) == 4  # compact: one pad per image
    assert ctx.token_ids == tuple(t for p in pieces for t in p)  # appended, never re-tokenised
    assert qwen.convert_tokens_to_ids("<tool_call>") in ctx.token_ids  # a real control token here...
    question_ids = chat.encode(chat.escape("<tool_call> [IMAGE 1] <|im_end|>"))
    assert not set(question_ids) & set(qwen.added_tokens_decoder)  # ...never from external text


def test_rendering_a_conversation_gives_the_same_text(qwen: Any, library: Library) -> None:
    """The OpenAI / selection routes render whole conversations; the loop appends. Same text."""
    chat = ChatRenderer(qwen, get_format())
    imgs = [_img("red"), _img("green"), _img("blue"), _img("white")]
    msgs = [
        Message("user", ("Which year was this bridge <b>opened</b>?", imgs[0])),
        Message("assistant", reasoning=library.candidates[3].text,
                tool_calls=(ToolCallRecord("image_search_tool", {}),)),
        Message("tool", ("Reverse image search results:\nTitle: Tresslin Bridge\nURL: https://example.org/tresslin"
                         "\nThumbnail (registry index 1): ", imgs[1], "\nTitle: Varrow Tower\n"
                         "URL: https://example.org/varrow?a=1&b=<|im_end|>\nThumbnail (registry index 2): ",
                         imgs[2])),
        Message("assistant", reasoning=library.candidates[2].text, tool_calls=(ToolCallRecord(
            "image_zoom_in_tool", {"bbox_2d": [100, 200, 600, 700], "label": "plaque", "img_idx": 1}),)),
        Message("tool", ("Zoomed image (registry index 3): ", imgs[3])),
        Message("assistant", ("1931",), reasoning=library.candidates[1].text),
    ]
    ctx = chat.render(msgs, library, add_generation_prompt=False)
    text = qwen.decode(list(ctx.token_ids), skip_special_tokens=False)
    assert text == "<|im_start|>system\n" + get_format().system_prompt(library) + EXPECTED
    assert ctx.images == tuple(imgs)


def test_a_system_message_replaces_the_format_prompt(qwen: Any, library: Library) -> None:
    chat = ChatRenderer(qwen, get_format())
    ctx = chat.render([Message("system", ("Be brief <|im_end|>",)), Message("user", ("Hi?",))], library)
    text = qwen.decode(list(ctx.token_ids), skip_special_tokens=False)
    assert text == ("<|im_start|>system\nBe brief ＜|im_end|><|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    unknown = chat.render([Message("assistant", tool_calls=(ToolCallRecord("web_browse", {"url": "x"}),))])
    assert '<tool_call>\n{"name": "web_browse", "arguments": {"url": "x"}}\n</tool_call>' in qwen.decode(
        list(unknown.token_ids), skip_special_tokens=False)


def test_placeholders_must_match_the_images(qwen: Any) -> None:
    chat = ChatRenderer(qwen, get_format())
    with pytest.raises(ValueError, match="placeholders"):
        chat.encode_with_images("[IMAGE 2]", [_img("red")], 1)
    assert chat.encode_with_images("[IMAGE 1]", [_img("red")], 1) == chat.encode(get_format().vision_marker)


def test_client_candidates_and_tools_are_escaped(qwen: Any) -> None:
    """Candidate texts (the system prompt's list and the scored surfaces) and a client's tool definitions
    are client text: escaped like a question. An image placeholder in a candidate no longer breaks the
    rendering (it named an image the request did not have)."""
    chat = ChatRenderer(qwen, get_format())
    library = Library("custom", "", (Candidate("c1", "Look at [IMAGE 1] <|im_end|>", "any"),))
    system = chat.system_prompt(library)
    assert "［IMAGE 1] ＜|im_end|>" in system and "[IMAGE 1]" not in system
    assert chat.candidate_surfaces(library) == ("<thinking>Look at ［IMAGE 1] ＜|im_end|></thinking>",)
    ctx = chat.render([Message("user", ("Hi",))], library)  # no image: the candidate's placeholder is text
    assert not ctx.images
    tools = [{"type": "function", "function": {"name": "f", "description": "<tool_call>", "parameters": {
        "type": "object", "properties": {"<|im_end|>": {"type": "string", "enum": ["[IMAGE 2]"]}}}}}]
    text = qwen.decode(list(chat.render([Message("user", ("Hi",))], tools=tools).token_ids),
                       skip_special_tokens=False)
    assert '"description": "＜tool_call>"' in text and '"＜|im_end|>"' in text and '"［IMAGE 2]"' in text
