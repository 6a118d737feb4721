"""The SGLang engine: the same Engine protocol as the embedded engine, over SGLang's HTTP API.

Scoring goes through our ``/ssr/score`` route (one call: the route prefills the context once and scores
all candidates against SGLang's radix cache). Pointed at a plain SGLang server or at SGLang's router
(which proxies only standard routes), it does the same two steps itself over ``/generate``: the context
alone with ``max_new_tokens`` 0, then one batch of the K rows context+candidate with
``logprob_start_len = P - 1`` (P = SGLang's image-expanded context length, read from the first call).
``auto`` tries the route and falls back to the two steps for good on a 404.

Connection errors are retried (tenacity); a server that stays unreachable is ``EngineUnavailable``
(HTTP 503 at our edge), so the agent recovers by itself when SGLang comes back. Behind SGLang's router,
a request the router could not deliver (its worker died: a 500 ``call_upstream_request_error``; no
healthy worker: a 503 ``no_available_workers``) is the engine being unavailable too. Every ``/generate``
we send is stateless (a scoring step, or seeded decoding), so the whole step is sent again, a bounded
number of times with a backoff that spans the router's health checks: the router by then sends it to a
surviving worker. A cancelled call (the client of the run went away) is aborted on the SGLang side too,
through ``/abort_request``. ``ready`` asks the router's ``/readiness`` (503 without a healthy worker;
its ``/health`` answers 200 regardless), a plain SGLang server's ``/health``.

Every request carries the conversation's routing key (``routing.py``): behind the router's ``manual``
policy a run's steps all reach the worker that caches its prefix.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from ssr_server.core.errors import EngineError, EngineUnavailable, InvalidRequest
from ssr_server.core.protocol import CandidateScore, Context, FinishReason, Generation, GenerationParams
from ssr_server.engine.sglang.routing import (
    ERROR_CODE_HEADER,
    NO_WORKER,
    ROUTING_KEY_HEADER,
    UPSTREAM_FAILED,
    message_start_id,
    routing_key,
)
from ssr_server.engine.sglang.twostep import TwoStepError, score_two_step
from ssr_server.engine.stop import find_stop

_T = TypeVar("_T")
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


class _RouteMissing(Exception):
    pass


class _WorkerLost(EngineUnavailable):
    """The router could not deliver the request to a worker: sending the step again may reach another."""


class SGLangEngine:
    def __init__(self, url: str, *, model: str, scoring: str = "auto", timeout_s: float = 120.0,
                 retries: int = 3, worker_retries: int = 3, client: httpx.AsyncClient | None = None
                 ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        if scoring not in ("auto", "route", "generate"):
            raise EngineError(f"scoring must be auto, route or generate, not {scoring!r}")
        self.url = url.rstrip("/")
        self.model_name = model
        self.scoring = scoring
        self.retries = retries
        self.worker_retries = worker_retries
        self._tokenizer = AutoTokenizer.from_pretrained(model)
        config = AutoConfig.from_pretrained(model)
        self.image_token_id: int | None = getattr(config, "image_token_id", None)
        self._eos_ids = _eos_ids(self._tokenizer, config)
        self._msg_start = message_start_id(self._tokenizer)
        self._client = client or httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0), trust_env=False,
            limits=httpx.Limits(max_connections=128, max_keepalive_connections=64))
        self._aborts: set[asyncio.Task[None]] = set()
        self._ready_path: str | None = None  # /readiness (a router) or /health, found on first use
        self.calls = {"route": 0, "generate": 0, "aborted": 0, "resent": 0}

    @property
    def name(self) -> str:
        return "sglang"

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # ---- HTTP ----------------------------------------------------------------------------------
    def routing_key(self, ctx: Context) -> str:
        return routing_key(ctx, self._msg_start, self.image_token_id)

    async def _post(self, path: str, payload: dict[str, Any], rid: str | None = None,
                    key: str | None = None) -> Any:
        headers = {ROUTING_KEY_HEADER: key} if key else None
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_RETRYABLE), stop=stop_after_attempt(self.retries),
                wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True,
            ):
                with attempt:
                    resp = await self._client.post(path, json=payload, headers=headers)
        except asyncio.CancelledError:
            if rid is not None:
                self._abort(rid)
            raise
        except _RETRYABLE as exc:
            raise EngineUnavailable(f"SGLang at {self.url} is unreachable: {type(exc).__name__}") from None
        except httpx.TimeoutException:
            raise EngineError(f"SGLang at {self.url} did not answer {path} in time") from None
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"SGLang at {self.url} failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404 and path == "/ssr/score":
            raise _RouteMissing
        code = resp.headers.get(ERROR_CODE_HEADER, "")
        if code == NO_WORKER:
            raise _WorkerLost(f"SGLang's router at {self.url} has no healthy worker: "
                              f"{_error_message(resp)}")
        if code.startswith(UPSTREAM_FAILED) or resp.status_code in (502, 504):
            raise _WorkerLost(f"SGLang's router at {self.url} lost the worker serving {path} "
                              f"({resp.status_code} {code or 'bad gateway'}): {_error_message(resp)}")
        if resp.status_code == 503:
            raise EngineUnavailable(f"SGLang at {self.url} is not ready (503)")
        if resp.status_code >= 400:
            message = _error_message(resp)
            if resp.status_code in (400, 422):
                raise InvalidRequest(f"SGLang refused the request: {message}")
            raise EngineError(f"SGLang answered {resp.status_code} on {path}: {message}")
        try:
            return resp.json()
        except ValueError:
            raise EngineError(f"SGLang answered {path} with a body that is not JSON") from None

    def _abort(self, rid: str) -> None:
        async def abort() -> None:
            try:
                await self._client.post("/abort_request", json={"rid": rid}, timeout=5.0)
                self.calls["aborted"] += 1
            except httpx.HTTPError:
                pass

        task = asyncio.get_running_loop().create_task(abort())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    @staticmethod
    def _images(ctx: Context) -> list[str]:
        return [base64.b64encode(img.png_bytes()).decode() for img in ctx.images]

    async def _resending(self, step: Callable[[], Awaitable[_T]]) -> _T:
        """``step`` again while the router lost its worker: at most ``worker_retries`` more times, backing
        off 0.5, 1, 2 s (over the router's health-check interval in the harness and the manifests)."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_WorkerLost), stop=stop_after_attempt(self.worker_retries + 1),
                wait=wait_exponential(multiplier=0.5, max=4.0), reraise=True,
                before_sleep=lambda _: self._count_resend(),
            ):
                with attempt:
                    return await step()
        except _WorkerLost as exc:
            raise EngineUnavailable(f"{exc.message} (sent {self.worker_retries + 1} times)") from None
        raise AssertionError("unreachable: tenacity returns or raises")

    def _count_resend(self) -> None:
        self.calls["resent"] += 1

    # ---- Engine protocol -----------------------------------------------------------------------
    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[CandidateScore]:
        cands = [list(c) for c in candidates]
        if not cands or any(len(c) == 0 for c in cands):
            raise InvalidRequest("candidates must be a non-empty list of non-empty token lists")
        return await self._resending(lambda: self._score(context, cands))

    async def _score(self, context: Context, cands: list[list[int]]) -> list[CandidateScore]:
        if self.scoring != "generate":
            try:
                return await self._score_route(context, cands)
            except _RouteMissing:
                if self.scoring == "route":
                    raise EngineError("SGLang has no /ssr/score route (start it with ssr-server "
                                      "sglang-launch, or set scoring to generate)") from None
                self.scoring = "generate"  # a plain server or the router: use /generate from now on
        return await self._score_two_step(context, cands)

    async def _score_route(self, ctx: Context, cands: list[list[int]]) -> list[CandidateScore]:
        payload: dict[str, Any] = {"input_ids": list(ctx.token_ids), "candidates": cands}
        if ctx.images:
            payload["image_data"] = self._images(ctx)
        body = await self._post("/ssr/score", payload, key=self.routing_key(ctx))
        self.calls["route"] += 1
        total = int(body.get("context_tokens", 0))
        return [CandidateScore(tuple(float(x) for x in s["token_logprobs"]),
                               cached_tokens=int(s.get("cached_tokens", 0)), context_tokens=total)
                for s in body["scores"]]

    async def _score_two_step(self, ctx: Context, cands: list[list[int]]) -> list[CandidateScore]:
        key = self.routing_key(ctx)

        async def generate(payload: dict[str, Any]) -> Any:
            self.calls["generate"] += 1
            return await self._post("/generate", payload, key=key)

        try:
            res = await score_two_step(generate, ctx.token_ids, self._images(ctx), cands)
        except TwoStepError as exc:
            raise EngineError(f"SGLang's scoring answer failed a check: {exc.message}") from None
        return [CandidateScore(tuple(lps), cached_tokens=c, context_tokens=res.context_tokens)
                for lps, c in zip(res.token_logprobs, res.cached_tokens, strict=True)]

    async def generate(self, context: Context, params: GenerationParams) -> Generation:
        if params.max_new_tokens < 1:
            raise InvalidRequest("max_new_tokens must be >= 1")
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1,
            "skip_special_tokens": False, "no_stop_trim": True, "ignore_eos": params.ignore_eos,
        }
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.grammar is not None:  # json_schema | ebnf | regex: SGLang's own sampling parameters
            sampling[params.grammar.kind] = params.grammar.source
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        payload: dict[str, Any] = {"input_ids": list(context.token_ids), "sampling_params": sampling}
        if context.images:
            payload["image_data"] = self._images(context)
        t0 = time.perf_counter()
        key = self.routing_key(context)

        async def send() -> Any:  # a new request id each time: a worker may still hold the last one
            rid = uuid.uuid4().hex
            return await self._post("/generate", {**payload, "rid": rid}, rid=rid, key=key)

        body = await self._resending(send)
        self.calls["generate"] += 1
        meta = body.get("meta_info", {})
        ids = tuple(int(t) for t in body.get("output_ids", ()))
        text = str(body.get("text", ""))
        fr = meta.get("finish_reason") or {}
        reason: FinishReason = "length"
        stop_text: str | None = None
        if fr.get("type") == "stop":
            matched = fr.get("matched")
            if isinstance(matched, str):
                reason, stop_text = "stop", matched
            else:
                reason = "eos"
        if params.stop and (hit := find_stop(text, params.stop)) is not None:
            reason, stop_text, text = "stop", hit[1], text[: hit[0]]
        if params.grammar is not None and reason in ("eos", "stop") and stop_text is None:
            # SGLang ends a finished grammar with the end-of-sequence token: the text is complete
            # (our contract: finish "stop", the end token not returned)
            if ids and ids[-1] in self._eos_ids:
                ids = ids[:-1]
            text = str(self._tokenizer.decode(list(ids), skip_special_tokens=False))
            reason = "stop"
        return Generation(
            token_ids=ids, text=text, finish_reason=reason, prompt_tokens=int(meta.get("prompt_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0)), elapsed_s=time.perf_counter() - t0,
            stop_text=stop_text, timings={"generate_s": time.perf_counter() - t0},
            forwards=decode_forwards(meta),
        )

    async def flush_cache(self, timeout_s: float = 60.0) -> None:
        """Empty SGLang's radix cache (benchmarks measure cold scoring with it).

        SGLang refuses a flush while any request is queued or running, and a request whose answer has
        just arrived can still count as running for a moment (seen on a busy machine: ``#running-req:
        1`` after every response was in). ``?timeout=`` makes SGLang's scheduler wait until it is idle
        before flushing; a refusal (another flush in progress, still busy) is retried until
        ``timeout_s`` has passed, then ``EngineError`` says why.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        reason = "no answer yet"
        while (left := deadline - loop.time()) > 0:
            wait_s = min(left, 10.0)
            try:
                resp = await self._client.post("/flush_cache", params={"timeout": f"{wait_s:.3f}"},
                                               timeout=wait_s + 10.0)
            except httpx.HTTPError as exc:
                raise EngineUnavailable(f"SGLang at {self.url} failed on /flush_cache: "
                                        f"{type(exc).__name__}") from None
            if resp.status_code == 200:
                return
            reason = f"HTTP {resp.status_code}: {resp.text.strip()[:200]}"
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
        raise EngineError(f"SGLang at {self.url} did not flush its cache within {timeout_s:g} s "
                          f"(it refuses while requests are queued or running); last answer: {reason}")

    async def ready(self) -> bool:
        try:
            if self._ready_path is None:
                resp = await self._client.get("/readiness", timeout=3.0)
                if resp.status_code != 404:  # a router: ready while it has a healthy worker
                    self._ready_path = "/readiness"
                    return resp.status_code == 200
                self._ready_path = "/health"
            resp = await self._client.get(self._ready_path, timeout=3.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def close(self) -> None:
        for task in list(self._aborts):
            await asyncio.wait({task}, timeout=2.0)
        await self._client.aclose()


def _eos_ids(tokenizer: Any, config: Any) -> frozenset[int]:
    found = (tokenizer.eos_token_id, getattr(config, "eos_token_id", None))
    ids = {int(t) for t in found if isinstance(t, int)}
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return frozenset(ids)


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if "message" in body:
            return str(body["message"])[:300]
    return str(body)[:300]


def decode_forwards(meta: dict[str, Any]) -> int:
    """Decode forwards of a generation from SGLang's meta_info: its verify passes when it runs
    speculative decoding (``--speculative-algorithm NGRAM``), else one per token after the first."""
    verify = meta.get("spec_verify_ct")
    if isinstance(verify, int) and verify > 0:
        return verify
    return max(0, int(meta.get("completion_tokens", 0)) - 1)
