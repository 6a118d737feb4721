"""``POST /ssr/score`` inside a real SGLang server, against a plain transformers forward (float32)."""

from __future__ import annotations

import base64
import io
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

pytestmark = pytest.mark.sglang

TOL = 1e-4
CANDIDATE_TEXTS = (
    "I do not yet know what this object is, so searching with the image should identify it.",
    "The evidence gathered so far answers the question, so I can answer now.",
    "A detail in the image is too small to read; zooming into that region should make it clear.",
    "zoom",
)


# --------------------------------------------------------------------------- reference (transformers)


class Reference:
    """The same safetensors in the test process (project venv), one full forward per candidate."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoTokenizer, Qwen3VLForConditionalGeneration

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.image_processor = AutoImageProcessor.from_pretrained(model_dir)
        self.model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        cfg = self.model.config
        self.image_token_id = int(cfg.image_token_id)
        self.vocab_size = int(cfg.text_config.vocab_size)
        self.merge = int(cfg.vision_config.spatial_merge_size)

    def chat(self, content: Any) -> list[int]:
        out: Any = self.tok.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
        )
        ids: Any = out if isinstance(out, list) else out["input_ids"]  # BatchEncoding in transformers 5
        return [int(t) for t in ids]

    def expand(self, ctx: Sequence[int], images: Sequence[Image.Image]) -> tuple[list[int], dict[str, Any]]:
        """Compact context -> the model's input: each image pad repeated once per merged patch."""
        if not images:
            return list(ctx), {}
        pix = self.image_processor(images=list(images), return_tensors="pt")
        counts = [int(g.prod()) // self.merge**2 for g in pix["image_grid_thw"]]
        ids: list[int] = []
        k = 0
        for t in ctx:
            if t == self.image_token_id:
                ids += [t] * counts[k]
                k += 1
            else:
                ids.append(t)
        assert k == len(images)
        return ids, {"pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"]}

    def logprobs(
        self, ctx: Sequence[int], cand: Sequence[int], images: Sequence[Image.Image] = ()
    ) -> tuple[list[float], int]:
        torch = self.torch
        ids, extra = self.expand(ctx, images)
        full = torch.tensor([ids + list(cand)])
        if extra:  # transformers 5.24 wants the token types with images (1 = image, for M-RoPE)
            extra["mm_token_type_ids"] = (full == self.image_token_id).long()
        with torch.no_grad():
            logits = self.model(input_ids=full, **extra).logits[0]
        lp = torch.log_softmax(logits.float(), dim=-1)
        n = len(ids)
        return [float(lp[n - 1 + j, t]) for j, t in enumerate(cand)], n


@pytest.fixture(scope="module")
def ref(tiny_model_dir: Path) -> Reference:
    return Reference(tiny_model_dir)


# --------------------------------------------------------------------------- helpers


def png_b64(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def make_image(w: int = 224, h: int = 160) -> Image.Image:
    """Deterministic, structured pixels (224x160 = 7x5 blocks of 32: the processor does not resize)."""
    im = Image.new("RGB", (w, h))
    im.putdata(
        [((x * 7 + y) % 256, (x * y) % 256, (3 * x + 5 * y) % 256) for y in range(h) for x in range(w)]
    )
    return im


def post_score(url: str, body: Any, timeout: float = 120.0) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/ssr/score", json=body, timeout=timeout)
    return r, time.perf_counter() - t0


def check_against_reference(
    ref: Reference,
    resp: dict[str, Any],
    ctx: list[int],
    cands: list[list[int]],
    images: Sequence[Image.Image] = (),
) -> None:
    assert len(resp["scores"]) == len(cands)
    for row, (s, cand) in enumerate(zip(resp["scores"], cands, strict=True)):
        expected, expanded_len = ref.logprobs(ctx, cand, images)
        assert resp["context_tokens"] == expanded_len
        assert s["num_tokens"] == len(cand)
        assert len(s["token_logprobs"]) == len(cand)
        assert all(math.isfinite(v) for v in s["token_logprobs"])
        diff = max(abs(a - b) for a, b in zip(s["token_logprobs"], expected, strict=True))
        assert diff < TOL, f"row {row}: max |sglang - transformers| = {diff:.2e}"
        assert s["logprob_sum"] == pytest.approx(sum(expected), abs=TOL * len(cand))
        # the whole context but its last token came from the radix cache
        assert s["cached_tokens"] >= len(ctx) - 1
        assert s["cached_tokens"] >= resp["context_tokens"] - 1


# --------------------------------------------------------------------------- tests


def test_score_text_context(sglang_url: str, ref: Reference) -> None:
    ctx = ref.chat("You are a visual search assistant. What is the name of this landmark? Think, then act.")
    cands = [ref.tok.encode(t) for t in CANDIDATE_TEXTS]
    lat = []
    for _ in range(3):
        r, dt = post_score(sglang_url, {"input_ids": ctx, "candidates": cands})
        assert r.status_code == 200, r.text
        lat.append(dt)
    body = r.json()
    assert body["context_tokens"] == len(ctx) == body["compact_context_tokens"]
    assert body["context_cached_tokens"] >= len(ctx) - 1  # the context was cached by the first call
    check_against_reference(ref, body, ctx, cands)
    print(
        f"\n/ssr/score text: ctx {len(ctx)} tokens, K={len(cands)}: "
        f"latencies {[f'{x * 1000:.0f} ms' for x in lat]}, server timings {body['timings']}"
    )


def test_score_image_context(sglang_url: str, ref: Reference) -> None:
    image = make_image()
    ctx = ref.chat([{"type": "image"}, {"type": "text", "text": "What animal is shown? Where does it live?"}])
    assert ctx.count(ref.image_token_id) == 1  # compact: one pad per image
    cands = [ref.tok.encode(t) for t in CANDIDATE_TEXTS]
    body_in = {"input_ids": ctx, "image_data": [png_b64(image)], "candidates": cands}
    lat = []
    for _ in range(2):
        r, dt = post_score(sglang_url, body_in)
        assert r.status_code == 200, r.text
        lat.append(dt)
    body = r.json()
    assert body["compact_context_tokens"] == len(ctx)
    assert body["context_tokens"] > len(ctx)  # SGLang expanded the pad
    assert body["context_cached_tokens"] >= body["context_tokens"] - 1
    check_against_reference(ref, body, ctx, cands, [image])
    print(
        f"\n/ssr/score image: ctx {len(ctx)} compact / {body['context_tokens']} expanded, "
        f"K={len(cands)}: latencies {[f'{x * 1000:.0f} ms' for x in lat]}, timings {body['timings']}"
    )


def test_score_two_resized_images(sglang_url: str, ref: Reference) -> None:
    """Sizes the processor must resize: equal only when both sides use the same (PIL) preprocessing."""
    images = [make_image(200, 150), make_image(640, 480).transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    ctx = ref.chat(
        [
            {"type": "image"},
            {"type": "text", "text": "Compare"},
            {"type": "image"},
            {"type": "text", "text": "Which country?"},
        ]
    )
    cands = [ref.tok.encode(t) for t in CANDIDATE_TEXTS[:2]]
    r, _ = post_score(
        sglang_url, {"input_ids": ctx, "image_data": [png_b64(i) for i in images], "candidates": cands}
    )
    assert r.status_code == 200, r.text
    check_against_reference(ref, r.json(), ctx, cands, images)


def test_next_turn_reuses_previous_rows(sglang_url: str, ref: Reference) -> None:
    """Turn t+1's context = turn t's context + the chosen candidate + more: found in the radix cache."""
    ctx = ref.chat("How tall is the Eiffel Tower? Think, then act.")
    cands = [ref.tok.encode(t) for t in CANDIDATE_TEXTS]
    r, _ = post_score(sglang_url, {"input_ids": ctx, "candidates": cands})
    assert r.status_code == 200, r.text
    nxt = ctx + cands[1] + ref.tok.encode(" <answer>The tower is 330 metres tall.</answer>")
    r, _ = post_score(sglang_url, {"input_ids": nxt, "candidates": cands})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["context_cached_tokens"] >= len(ctx) + len(cands[1]) - 1
    check_against_reference(ref, body, nxt, cands)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    return str(err["message"])


def test_bad_inputs_are_4xx_json(sglang_url: str, ref: Reference) -> None:
    ctx = ref.chat("What colour is the car?")
    good = [ref.tok.encode("zoom")]
    v = ref.vocab_size
    cases: list[tuple[Any, int, str]] = [
        ({"input_ids": ctx, "candidates": []}, 422, "candidates is empty"),
        ({"input_ids": ctx, "candidates": [[]]}, 422, "candidates[0] is empty"),
        ({"input_ids": [], "candidates": good}, 422, "empty"),
        ({"input_ids": ctx, "candidates": [[v]]}, 422, "outside the vocabulary"),
        ({"input_ids": ctx, "candidates": [[10**12]]}, 422, "outside the vocabulary"),
        ({"input_ids": ctx, "candidates": [[-1]]}, 422, "outside the vocabulary"),
        ({"input_ids": [*ctx, v + 5], "candidates": good}, 422, "outside the vocabulary"),
        ({"input_ids": ctx, "candidates": [[ref.image_token_id]]}, 422, "pad"),
        ({"input_ids": ctx, "image_data": [png_b64(make_image())], "candidates": good}, 422, "image pad"),
        ({"input_ids": [*ctx, ref.image_token_id], "candidates": good}, 422, "image pad"),
        (
            {"input_ids": [*ctx, ref.image_token_id], "image_data": ["not base64!"], "candidates": good},
            422,
            "base64",
        ),
        (
            {"input_ids": [*ctx, ref.image_token_id], "image_data": ["aGVsbG8="], "candidates": good},
            422,
            "image",
        ),
        (
            {
                "input_ids": [*ctx, ref.image_token_id],
                "image_data": ["http://example.com/x.png"],
                "candidates": good,
            },
            422,
            "base64",
        ),
        ({"input_ids": ctx, "candidates": ["zoom"]}, 400, "integers"),
        ({"input_ids": ctx, "candidates": [[1.5]]}, 400, "integers"),
        ({"input_ids": ctx}, 400, "required"),
        ([1, 2, 3], 400, "object"),
        ({"input_ids": ctx, "candidates": good, "extra": 1}, 400, "unknown"),
        ({"input_ids": ctx * 2000, "candidates": good}, 422, "SGLang refused"),
    ]
    for body, status, needle in cases:
        r, _ = post_score(sglang_url, body)
        msg = _error(r, status)
        assert needle in msg, (body if len(str(body)) < 300 else str(body)[:300], msg)
    r = httpx.post(
        f"{sglang_url}/ssr/score",
        content=b"{not json",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    _error(r, 400)
    # the engine survived all of that
    r, _ = post_score(sglang_url, {"input_ids": ctx, "candidates": good})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{sglang_url}/health", timeout=30).status_code == 200
