"""Turn a compact Context into the token ids, image tensors and rotary positions the model consumes.

The compact form has one image-pad token per image; here each becomes ``t*h*w / merge**2`` pad tokens.
For prefix matching every pad token is replaced by a negative id derived from its image's digest, so
two contexts match only where they hold the same pixels (SGLang's radix cache does the same with its
``pad_value``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ssr_server.core.errors import InvalidRequest
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.torch.loader import LoadedModel


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: torch.Tensor  # (num_patches, C * temporal_patch * patch * patch), on the model's device
    grid_thw: tuple[int, int, int]
    num_tokens: int  # after the merge


@dataclass(frozen=True)
class Expanded:
    """A context as the model sees it."""

    ids: list[int]  # expanded token ids
    key: tuple[int, ...]  # ids with image pads replaced by per-image negative ids (prefix matching)
    image_spans: list[tuple[int, int]]  # [start, end) of each image's pad run, in order
    images: list[ProcessedImage]


class ImageCache:
    """Bounded LRU of processed images by digest: turn t+1 must not re-run the image processor."""

    def __init__(self, capacity: int = 128) -> None:
        self._items: OrderedDict[str, ProcessedImage] = OrderedDict()
        self.capacity = capacity

    def get(self, model: LoadedModel, ref: ImageRef) -> ProcessedImage:
        hit = self._items.get(ref.digest)
        if hit is not None:
            self._items.move_to_end(ref.digest)
            return hit
        if model.image_processor is None:
            raise InvalidRequest("this model has no vision tower: images are not supported")
        with torch.device("cpu"):  # the processor builds its tensors on the CPU, explicitly
            out = model.image_processor(images=[ref.image], return_tensors="pt")
        t, h, w = (int(x) for x in out["image_grid_thw"][0].tolist())
        item = ProcessedImage(
            pixel_values=out["pixel_values"].to(device=model.device, dtype=model.dtype),
            grid_thw=(t, h, w),
            num_tokens=t * h * w // (model.merge_size**2),
        )
        self._items[ref.digest] = item
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return item


def _image_key(digest: str) -> int:
    return -1 - int(digest[:15], 16)


def expand(model: LoadedModel, ctx: Context, images: ImageCache) -> Expanded:
    pad = model.image_token_id
    tokens = ctx.token_ids
    n_pads = tokens.count(pad) if pad is not None else 0
    if pad is None and ctx.images:
        raise InvalidRequest(f"this model takes no images (a text-only model): send the request without "
                             f"its {len(ctx.images)} image(s)")
    if n_pads != len(ctx.images):
        raise InvalidRequest(
            f"context has {n_pads} image placeholders but {len(ctx.images)} images"
        )
    if pad is None or not n_pads:
        return Expanded(ids=list(tokens), key=tokens, image_spans=[], images=[])
    # the text between placeholders copied as slices, not a Python step per token: a context is
    # expanded twice a turn (selection, action), 0.38 ms a call that way on the demo world, 0.02 now
    ids: list[int] = []
    key: list[int] = []
    spans: list[tuple[int, int]] = []
    processed: list[ProcessedImage] = []
    start = 0
    for ref in ctx.images:
        at = tokens.index(pad, start)
        ids += tokens[start:at]
        key += tokens[start:at]
        p = images.get(model, ref)
        spans.append((len(ids), len(ids) + p.num_tokens))
        processed.append(p)
        ids += [pad] * p.num_tokens
        key += [_image_key(ref.digest)] * p.num_tokens
        start = at + 1
    ids += tokens[start:]
    key += tokens[start:]
    return Expanded(ids=ids, key=tuple(key), image_spans=spans, images=processed)


def positions(model: LoadedModel, exp: Expanded, start: int, end: int, next_pos: int,
              ) -> tuple[torch.Tensor, int]:
    """Rotary positions for expanded tokens [start, end), given the position that follows ``start``.

    Text models: ``(1, n)`` running positions. Qwen-VL models: ``(3, n)`` M-RoPE positions (temporal,
    height, width): text tokens advance all three together; an image of merged grid h x w takes
    ``(p, p+i, p+j)`` and advances the position by ``max(h, w)``. This mirrors transformers'
    ``get_rope_index`` for single-frame images, computed incrementally so a cached prefix never has
    to be walked again. Returns the positions and the position that follows ``end``.
    """
    dev = model.device
    if not model.is_vl:
        pos = torch.arange(next_pos, next_pos + (end - start), device=dev).view(1, -1)
        return pos, next_pos + (end - start)
    parts: list[torch.Tensor] = []
    i = start
    cur = next_pos
    spans = iter([s for s in zip(exp.image_spans, exp.images, strict=True) if s[0][1] > start])
    span = next(spans, None)
    while i < end:
        if span is not None and span[0][0] <= i:
            (s0, s1), img = span
            if s0 < start or s1 > end:
                raise ValueError("a model-input chunk must not split an image")
            _, h, w = img.grid_thw
            gh, gw = h // model.merge_size, w // model.merge_size
            hh = torch.arange(gh, device=dev).view(-1, 1).expand(gh, gw).reshape(-1)
            ww = torch.arange(gw, device=dev).view(1, -1).expand(gh, gw).reshape(-1)
            parts.append(torch.stack([torch.zeros_like(hh), hh, ww]) + cur)
            cur += max(gh, gw)
            i = s1
            span = next(spans, None)
        else:
            stop = min(end, span[0][0] if span is not None else end)
            parts.append(torch.arange(cur, cur + stop - i, device=dev).view(1, -1).expand(3, -1))
            cur += stop - i
            i = stop
    pos = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long, device=dev)
    return pos, cur


def images_in(exp: Expanded, start: int, end: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """pixel_values and image_grid_thw of the images whose pad runs lie in [start, end)."""
    chosen = [img for (s0, _), img in zip(exp.image_spans, exp.images, strict=True) if start <= s0 < end]
    if not chosen:
        return None, None
    pixel_values = torch.cat([c.pixel_values for c in chosen], dim=0)
    grid = torch.tensor([c.grid_thw for c in chosen], dtype=torch.long, device=pixel_values.device)
    return pixel_values, grid


def safe_cut(exp: Expanded, n: int) -> int:
    """The largest cut <= n that does not fall inside an image's pad run."""
    for s0, s1 in exp.image_spans:
        if s0 < n < s1:
            return s0
    return n
