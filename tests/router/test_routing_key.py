"""The routing key the SGLang client sends SGLang's router: one per conversation, on the shipped model's
real tokenizer and chat format (no server)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from ssr_server.agent.chat import ChatRenderer
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.sglang.routing import message_start_id, routing_key
from ssr_server.models import default_model_dir
from ssr_server.tools.demo import demo_picture, shipped_demo_world


@pytest.fixture(scope="module")
def chat() -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(str(default_model_dir())), get_format())


def _key(chat: ChatRenderer, ctx: Context) -> str:
    from transformers import AutoConfig

    image_token = getattr(AutoConfig.from_pretrained(str(default_model_dir())), "image_token_id", None)
    return routing_key(ctx, message_start_id(chat.tokenizer), image_token)


def test_one_key_per_conversation(chat: ChatRenderer) -> None:
    lib = LibraryRegistry().get("default")
    ids = shipped_demo_world().entity_ids()
    img, other_img = (ImageRef.from_pil(demo_picture(e)) for e in ids[:2])
    start = chat.start("What is this landmark?", [img], lib)
    key = _key(chat, start)
    # every later turn of the run extends the context: reasoning, action, observation, a zoomed image
    tok = chat.tokenizer
    later = start.extend(tok.encode("I search with the image.<|im_end|>\n<|im_start|>user\nresult"))
    later = later.extend(tok.encode("<|im_end|>\n<|im_start|>assistant\n"), [other_img])
    assert _key(chat, later) == key
    # another question, or the same question about another picture, is another conversation
    assert _key(chat, chat.start("How tall is this landmark?", [img], lib)) != key
    assert _key(chat, chat.start("What is this landmark?", [other_img], lib)) != key
    # a context of fewer than three messages is its own root
    short = Context(tuple(tok.encode("plain text")))
    assert _key(chat, short) != _key(chat, short.extend(tok.encode(" more")))
