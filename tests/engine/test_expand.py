"""``multimodal.expand``: each image placeholder becomes its image's pad tokens, keyed by its pixels."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from ssr_server.core.errors import InvalidRequest
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.torch.multimodal import ImageCache, ProcessedImage, expand

PAD = 7


class Sized(ImageCache):
    """Images of a set number of tokens each (by their red value), without an image processor."""

    def get(self, model: Any, ref: ImageRef) -> ProcessedImage:
        n = ref.image.getpixel((0, 0))[0]  # type: ignore[index]
        return ProcessedImage(pixel_values=None, grid_thw=(1, 2, n * 2), num_tokens=n)  # type: ignore[arg-type]


def image(tokens: int) -> ImageRef:
    return ImageRef.from_pil(Image.new("RGB", (4, 4), (tokens, 0, 0)))


def reference(ctx: Context, cache: ImageCache) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Token by token, as the definition reads."""
    ids: list[int] = []
    key: list[int] = []
    spans = []
    refs = iter(ctx.images)
    for tok in ctx.token_ids:
        if tok != PAD:
            ids.append(tok)
            key.append(tok)
            continue
        ref = next(refs)
        n = cache.get(None, ref).num_tokens
        spans.append((len(ids), len(ids) + n))
        ids += [PAD] * n
        key += [-1 - int(ref.digest[:15], 16)] * n
    return ids, key, spans


@pytest.mark.parametrize("tokens", [
    (1, PAD, 2, 3, PAD, 4),  # text around and between
    (PAD, PAD, 5),  # images side by side, first
    (5, 6, PAD),  # an image last
])
def test_expand_matches_the_token_by_token_definition(tokens: tuple[int, ...]) -> None:
    model, cache = SimpleNamespace(image_token_id=PAD), Sized()
    ctx = Context(tokens, tuple(image(3 + i) for i in range(tokens.count(PAD))))
    exp = expand(model, ctx, cache)  # type: ignore[arg-type]
    ids, key, spans = reference(ctx, cache)
    assert (exp.ids, list(exp.key), exp.image_spans) == (ids, key, spans)
    assert [p.num_tokens for p in exp.images] == [3 + i for i in range(tokens.count(PAD))]
    # the key follows the pixels: an image of the same size but other pixels keys apart
    if tokens.count(PAD) == 2:
        twin = Context(tokens, (image(3), ImageRef.from_pil(Image.new("RGB", (4, 4), (4, 1, 0)))))
        other = expand(model, twin, cache)  # type: ignore[arg-type]
        assert other.ids == exp.ids and other.key != exp.key


def test_expand_without_images_and_miscounted_placeholders() -> None:
    model, cache = SimpleNamespace(image_token_id=PAD), Sized()
    exp = expand(model, Context((1, 2, 3)), cache)  # type: ignore[arg-type]
    assert (exp.ids, exp.key, exp.image_spans, exp.images) == ([1, 2, 3], (1, 2, 3), [], [])
    with pytest.raises(InvalidRequest, match="2 image placeholders but 1 images"):
        expand(model, Context((PAD, 1, PAD), (image(3),)), cache)  # type: ignore[arg-type]
    text_only = SimpleNamespace(image_token_id=None)
    assert expand(text_only, Context((PAD, 1)), cache).ids == [PAD, 1]  # type: ignore[arg-type]
