"""``ssr-server sglang-launch``: SGLang's own HTTP server plus our ``POST /ssr/score`` route.

This module runs *inside SGLang's process* (SGLang's venv): it parses SGLang's usual flags, adds the
route to ``sglang.srt.entrypoints.http_server.app`` and calls SGLang's ``launch_server``. SGLang is
imported lazily (in ``main`` and in the handler), so importing this module from the project's own
venv needs neither sglang nor torch.

Start it with ``python -m ssr_server.engine.sglang.server --model-path DIR ...`` (any SGLang flag), or
``ssr-server sglang-launch ...``; ``scripts/sglang-cpu.sh start`` does that for the CPU harness.

The route
=========
``POST /ssr/score`` with JSON::

    {"input_ids":  [int, ...],          # the COMPACT context: one <|image_pad|> per image
     "image_data": ["<base64 PNG>", ...], # optional; one per <|image_pad|>, in order
     "candidates": [[int, ...], ...]}   # K >= 1 non-empty token-id lists

It sends the context alone once (``max_new_tokens`` 0) so that the radix cache holds it, then one
batched request of the K rows ``context + candidate`` with ``logprob_start_len = P - 1``, where P is the
context's length *as SGLang sees it* (see below), ``return_logprob`` true and ``max_new_tokens`` 0.
Every returned token id is checked against the candidate and every log-probability for finiteness.

200::

    {"scores": [{"token_logprobs": [float, ...], "logprob_sum": float, "num_tokens": int,
                 "cached_tokens": int}, ...],          # in candidate order
     "context_tokens": int,            # P: SGLang's (image-expanded) context length
     "compact_context_tokens": int,    # len(input_ids)
     "context_cached_tokens": int,     # context tokens already cached when the context call came
     "timings": {"validate_s", "context_s", "score_s", "total_s"}}

Errors are JSON ``{"error": {"message": str, "type": str}}``: 400 for malformed JSON or a body of the
wrong shape, 422 for well-formed but unusable input (empty candidates, token ids out of the vocabulary,
image-pad count not matching ``image_data``, undecodable images, too long for the model), 500 when
SGLang's answer fails the checks (wrong token ids, non-finite values), 503 before the engine is up.

Images and ``logprob_start_len``
================================
SGLang expands each ``<|image_pad|>`` into one pad per merged patch (and swaps the pad ids for
per-image hash values, which is what lets the radix cache share image prefixes). ``logprob_start_len``
and ``cached_tokens`` are positions in that EXPANDED sequence, so ``len(input_ids) - 1`` would be wrong
for an image context (it would start the logprobs inside the context and switch prefix reuse off).
The route takes P from the context call's ``meta_info["prompt_tokens"]`` (the expanded length) and uses
``P - 1``; it then checks the answer has exactly ``1 + len(candidate)`` entries per row.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssr_server.core.limits import MAX_CANDIDATES
from ssr_server.engine.sglang.twostep import TwoStepError, score_two_step

ROUTE = "/ssr/score"


class ScoreError(Exception):
    """An error the route answers as JSON with ``status``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


@dataclass(frozen=True)
class ScoreRequest:
    input_ids: list[int]
    image_data: list[str]
    candidates: list[list[int]]


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise ScoreError(400, f"{what} must be a list of integers")
    return value


def parse_score_request(
    body: Any, vocab_size: int, image_token_id: int | None, video_token_id: int | None = None
) -> ScoreRequest:
    """Validate a ``/ssr/score`` body. Pure: no SGLang needed (unit-testable in the project venv)."""
    if not isinstance(body, dict):
        raise ScoreError(400, "body must be a JSON object")
    unknown = set(body) - {"input_ids", "image_data", "candidates"}
    if unknown:
        raise ScoreError(400, f"unknown fields: {sorted(unknown)}")
    if "input_ids" not in body or "candidates" not in body:
        raise ScoreError(400, "input_ids and candidates are required")
    ctx = _int_list(body["input_ids"], "input_ids")
    cands_raw = body["candidates"]
    if not isinstance(cands_raw, list):
        raise ScoreError(400, "candidates must be a list of lists of integers")
    cands = [_int_list(c, f"candidates[{i}]") for i, c in enumerate(cands_raw)]
    images_raw = body.get("image_data") or []
    if not isinstance(images_raw, list) or not all(isinstance(s, str) for s in images_raw):
        raise ScoreError(400, "image_data must be a list of base64 strings")

    if not ctx:
        raise ScoreError(422, "input_ids (the context) is empty")
    if not cands:
        raise ScoreError(422, "candidates is empty")
    if len(cands) > MAX_CANDIDATES:
        raise ScoreError(422, f"too many candidates: {len(cands)} > {MAX_CANDIDATES}")
    for i, c in enumerate(cands):
        if not c:
            raise ScoreError(422, f"candidates[{i}] is empty")

    def check_range(ids: Sequence[int], what: str) -> None:
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            raise ScoreError(422, f"{what} has token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}")

    check_range(ctx, "input_ids")
    media = {t for t in (image_token_id, video_token_id) if t is not None}
    for i, c in enumerate(cands):
        check_range(c, f"candidates[{i}]")
        if media.intersection(c):
            raise ScoreError(422, f"candidates[{i}] contains an image/video pad token")
    if video_token_id is not None and video_token_id in ctx:
        raise ScoreError(422, "video contexts are not supported")
    pads = ctx.count(image_token_id) if image_token_id is not None else 0
    if pads != len(images_raw):
        raise ScoreError(
            422,
            f"input_ids has {pads} image pad token(s) but image_data has {len(images_raw)} image(s); "
            "the context must be compact: exactly one <|image_pad|> per image",
        )
    return ScoreRequest(ctx, [_check_image(s, i) for i, s in enumerate(images_raw)], cands)


def _check_image(data: str, index: int) -> str:
    """Only base64 image bytes: never a URL or a path (SGLang's loader would fetch or open those)."""
    from PIL import Image, UnidentifiedImageError

    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ScoreError(422, f"image_data[{index}] is not valid base64: {e}") from None
    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ScoreError(422, f"image_data[{index}] is not a readable image: {e}") from None
    return base64.b64encode(raw).decode("ascii")


async def score(body: Any, request: Any) -> dict[str, Any]:
    """The route's work, on SGLang's tokenizer manager (runs in SGLang's event loop)."""
    from sglang.srt.entrypoints.http_server import get_global_state
    from sglang.srt.managers.io_struct import GenerateReqInput

    t0 = time.perf_counter()
    state = get_global_state()
    if state is None or state.tokenizer_manager is None:
        raise ScoreError(503, "SGLang engine is not ready", "unavailable")
    tm = state.tokenizer_manager
    hf = tm.model_config.hf_config
    req = parse_score_request(
        body,
        vocab_size=int(tm.model_config.vocab_size),
        image_token_id=getattr(hf, "image_token_id", None),
        video_token_id=getattr(hf, "video_token_id", None),
    )
    t1 = time.perf_counter()

    async def generate(payload: dict[str, Any]) -> Any:
        try:
            return await tm.generate_request(GenerateReqInput(**payload), request).__anext__()
        except ValueError as e:  # SGLang's own validation (lengths, images, ...)
            raise ScoreError(getattr(e, "status_code", 422) or 422, f"SGLang refused: {e}") from None

    try:
        res = await score_two_step(generate, req.input_ids, req.image_data, req.candidates)
    except TwoStepError as e:
        raise ScoreError(500, e.message, "engine_error") from None
    scores = [{"token_logprobs": lps, "logprob_sum": math.fsum(lps), "num_tokens": len(lps),
               "cached_tokens": c} for lps, c in zip(res.token_logprobs, res.cached_tokens, strict=True)]
    return {
        "scores": scores,
        "context_tokens": res.context_tokens,
        "compact_context_tokens": len(req.input_ids),
        "context_cached_tokens": res.context_cached_tokens,
        "timings": {"validate_s": t1 - t0, **res.timings, "total_s": time.perf_counter() - t0},
    }


def add_routes(app: Any) -> None:
    """Add ``POST /ssr/score`` to SGLang's FastAPI ``app``."""
    import logging

    from fastapi import Request
    from fastapi.responses import JSONResponse

    log = logging.getLogger("ssr_server.sglang")

    async def ssr_score(request: Request) -> JSONResponse:
        try:
            try:
                body = await request.json()
            except ValueError as e:
                raise ScoreError(400, f"body is not valid JSON: {e}") from None
            return JSONResponse(await score(body, request))
        except ScoreError as e:
            if e.status >= 500:
                log.error("%s %d: %s", ROUTE, e.status, e.message)
            return JSONResponse(e.body(), status_code=e.status)
        except Exception as e:  # never a bare 500 page: always a JSON error
            log.exception("%s failed", ROUTE)
            return JSONResponse(
                {"error": {"message": f"{type(e).__name__}: {e}", "type": "internal_error", "code": 500}},
                status_code=500,
            )

    # With ``from __future__ import annotations`` the annotation is the string "Request", which FastAPI
    # resolves in this module's globals (where fastapi is not imported: it is imported lazily), so it
    # would take ``request`` for a required query parameter. Give it the real class.
    ssr_score.__annotations__ = {"request": Request, "return": JSONResponse}
    app.add_api_route(ROUTE, ssr_score, methods=["POST"], include_in_schema=True)


def main(argv: Sequence[str]) -> None:
    """Parse SGLang's flags, add our route to SGLang's app, and run SGLang's HTTP server."""
    import os

    from sglang.srt.entrypoints.http_server import app, launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    except ImportError:
        pass
    argv = list(argv)
    if not any(a.startswith("--image-processor-backend") for a in argv):
        # The same resizing as the embedded engine (transformers' PIL processor): SGLang's default
        # (torchvision) resizes differently, moving image log-probs by up to 4e-3 (measured).
        argv += ["--image-processor-backend", "pil"]
    if "--constrained-json-disable-any-whitespace" not in argv:
        # Tool-call arguments are decoded under JSON schemas; with optional whitespace allowed a weak
        # model spends its whole budget on spaces and newlines (measured with xgrammar; see the notes).
        argv.append("--constrained-json-disable-any-whitespace")
    server_args = prepare_server_args(argv)
    if int(getattr(server_args, "tokenizer_worker_num", 1) or 1) > 1:
        raise SystemExit(
            f"{ROUTE} lives in the main process's app: --tokenizer-worker-num > 1 is not supported"
        )
    if hasattr(server_args, "resolve_once"):  # as sglang.launch_server.run_server does
        server_args.resolve_once()
    add_routes(app)
    try:
        launch_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def cli_main() -> None:
    main(sys.argv[1:])


if __name__ == "__main__":
    cli_main()
