"""A request's model work runs in a task of its own, so that whoever stops waiting can end it: a client
that goes away cancels it (its engine work is dropped, counted as ``client_disconnected``), and the
shutdown drain's deadline cancels it (the client then gets ``ShuttingDown``, a 503 it may retry on
another replica). The REST and OpenAI routes wait on, and stream from, their tasks this way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from fastapi import Request, Response

from ssr_server.core import metrics
from ssr_server.core.errors import ShuttingDown

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's code: nobody reads the answer, but access logs and metrics do
POLL_S = 0.25  # how often a waiting route looks for a client gone


def client_closed() -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def drop(task: asyncio.Task[Any]) -> None:
    """Cancel the work of a client that went away."""
    task.cancel()
    metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()


async def result_or_disconnect(task: asyncio.Task[T], request: Request, cut_message: str) -> T | None:
    """The task's result, or None when the client went away first (the task is then dropped).

    Errors the task raised propagate to the error handlers; a task that the shutdown drain's deadline
    cancelled raises ``ShuttingDown(cut_message)``."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=POLL_S)
        if done:
            if task.cancelled():  # by the drain's deadline (a client gone is handled below)
                raise ShuttingDown(cut_message)
            return task.result()
        if await request.is_disconnected():
            drop(task)
            return None


async def relay(task: asyncio.Task[Any], queue: asyncio.Queue[T]) -> AsyncGenerator[T, None]:
    """What the task puts on ``queue``, as soon as it is there, until the task ends; then what is left."""
    while True:
        getter = asyncio.ensure_future(queue.get())
        try:
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # A client gone closes this generator while it waits here: a getter left pending would be
            # destroyed later with "Task was destroyed but it is pending!" (one per disconnect).
            if not getter.done():
                getter.cancel()
        if getter in done:
            yield getter.result()
            continue
        while not queue.empty():
            yield queue.get_nowait()
        return


def failure(task: asyncio.Task[Any], cut_message: str) -> BaseException | None:
    """How an ended task failed (None: it did not). Cancelled means by the drain's deadline: a client gone
    ends the stream before this is asked."""
    return ShuttingDown(cut_message) if task.cancelled() else task.exception()


def drop_unfinished(task: asyncio.Task[Any]) -> None:
    """For a stream's ``finally``: a stream that ends before its task means the client went away."""
    if not task.done():
        drop(task)
