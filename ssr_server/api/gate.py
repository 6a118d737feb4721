"""The admission gate: a run, selection step or chat turn takes its slot from its headers, before a byte
of its body is read, and the route then takes over the ticket the gate holds (``admitted``,
``admitted_slot``): a refused request's body is never held or parsed, and a queued one's waits in the
client's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ssr_server.api.admission import EXPIRED, Admission, Ticket
from ssr_server.api.errors import error_response, retry_headers
from ssr_server.core import metrics
from ssr_server.core.errors import Overloaded, ShuttingDown

# The scope key under which ``AdmissionGate`` leaves the ticket it took for a request.
TICKET = "ssr.admission_ticket"
# The ``scope["extensions"]`` key of an ``asyncio.Event`` set when the request's connection is gone: set by
# ``ssr-server serve``'s protocol (``api.connections``), so that a queued request notices its client leaving
# without reading any of its body.
CONNECTION_LOST = "ssr.connection_lost"


def expects_continue(scope: Scope) -> bool:
    """The client sent ``Expect: 100-continue``: it holds its body back until the server first reads it
    (uvicorn then answers 100 Continue), or sends none at all when the final answer comes first."""
    return any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope.get("headers", ()))


def route_path(scope: Scope) -> str:
    """The path the app routes on (without a ``root_path`` the server put in front of it)."""
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    return path[len(root):] if root and path.startswith(root) else path


class AdmissionGate:
    """ASGI middleware: a run, selection step or chat turn takes its slot here, from its headers, before
    any of its body is read. A refusal (429, or 503 while draining) is sent at once: a client that sent
    ``Expect: 100-continue`` then sends no body at all; any other client's body is discarded by the server
    as it streams, never held or parsed, and the connection stays usable. A queued request's body waits
    in the client's socket until it is admitted (past what the server reads before it stops reading: at
    most 32 KB under ``ssr-server serve``'s protocol, ``api.connections.GuardedHttp``; uvicorn's own reads
    up to 64 KB + 256 KB).

    The admitted request goes on with its ticket in ``scope[TICKET]``; its route takes it (``admitted``,
    ``admitted_slot``), and the gate gives the slot back itself when the route never did (the body timed
    out or failed to parse or validate, a 4xx before the work). Until the route takes it, the drain's
    deadline cancels the request like any admitted work (a JSON 503)."""

    def __init__(self, app: ASGIApp, admission: Callable[[], Admission | None],
                 paths: frozenset[str]) -> None:
        self.app, self.admission, self.paths = app, admission, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adm = (self.admission() if scope["type"] == "http" and scope["method"] == "POST"
               and route_path(scope) in self.paths else None)
        if adm is None:
            await self.app(scope, receive, send)
            return
        early: list[Message] = []  # what watching for the client leaving read of the body
        try:
            ticket = await _admit(adm, scope, receive, early)
        except (Overloaded, ShuttingDown) as exc:
            if isinstance(exc, Overloaded):
                metrics.REQUESTS_REJECTED.labels(reason="overloaded").inc()
            await _refuse(exc, scope, receive, send)
            return
        if ticket is None:  # the client left while queued: nobody to answer
            return
        await self._admitted(adm, ticket, scope, _replay(early, receive), send)

    async def _admitted(self, adm: Admission, ticket: Ticket, scope: Scope, receive: Receive,
                        send: Send) -> None:
        scope[TICKET] = ticket
        me = asyncio.current_task()
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            answered = True
            await send(message)

        if me is not None:
            ticket.bind(me)  # while the body is read and parsed: until the route takes the ticket
        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if me is None or not adm.was_cut(me):
                raise
            if not answered:  # the drain's deadline came before the route took the slot
                await _refuse(ShuttingDown(EXPIRED), scope, receive, send)
        finally:
            if not ticket.claimed:
                ticket.release()


async def _admit(adm: Admission, scope: Scope, receive: Receive, early: list[Message]) -> Ticket | None:
    """A ticket, or None when the client left while queued; raises the refusal."""
    if not adm.would_queue():
        return await adm.acquire()  # admits or refuses at once: no need to watch the client
    gone = _client_gone(scope, receive, early)
    return await adm.acquire() if gone is None else await acquire_unless(adm, gone)


def _client_gone(scope: Scope, receive: Receive,
                 early: list[Message]) -> Callable[[], Awaitable[object]] | None:
    """What ends when the client of a queued request has gone, if it can be told without reading its body."""
    lost = scope.get("extensions", {}).get(CONNECTION_LOST)
    if isinstance(lost, asyncio.Event):
        return lost.wait
    if expects_continue(scope):
        return None  # a receive() would send 100 Continue and so ask for the body

    async def watch() -> None:
        # Under another server: receive() hands over what is buffered (uvicorn: up to 64 KB) and keeps
        # it, so stop as soon as more body would follow; a short body, once whole, costs nothing more.
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            early.append(message)
            if message.get("more_body"):
                await asyncio.get_running_loop().create_future()  # until cancelled: no more reading

    return watch


def _replay(early: list[Message], receive: Receive) -> Receive:
    if not early:
        return receive

    async def replayed() -> Message:
        return early.pop(0) if early else await receive()

    return replayed


async def _refuse(exc: Overloaded | ShuttingDown, scope: Scope, receive: Receive, send: Send) -> None:
    # Keep-alive, on purpose: a client still sending its body gets it discarded by the server as it
    # streams (a close with unread data would reset the connection and lose the answer), and one that
    # sent Expect: 100-continue sends no body and closes (curl) or sends it anyway (discarded too).
    resp = error_response(exc.status_code, exc.code, exc.message, headers=retry_headers(exc),
                          path=scope["path"])
    await resp(scope, receive, send)


def admitted(scope: Scope) -> Ticket:
    """The request's slot, the one ``AdmissionGate`` took from its headers (the route now owns it)."""
    held = scope.get(TICKET)
    if not isinstance(held, Ticket):  # a route of ADMITTED_PATHS served without the gate: a wiring bug
        raise RuntimeError(f"{scope.get('path')} reached its route without an admission ticket")
    return held.claim()


@contextlib.asynccontextmanager
async def admitted_slot(scope: Scope) -> AsyncIterator[Ticket]:
    """``admitted`` for work done by the route's own task (``Ticket.hold``)."""
    async with admitted(scope).hold() as ticket:
        yield ticket


async def acquire_unless(admission: Admission, gone: Callable[[], Awaitable[object]]) -> Ticket | None:
    """Wait for an admission slot unless ``gone()`` ends first (the client left: None, its place given
    back). The refusals (``Overloaded``, ``ShuttingDown``) propagate."""
    acquiring = asyncio.ensure_future(admission.acquire())
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({acquiring, watching}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _abandon(acquiring)
        watching.cancel()
        raise
    watching.cancel()
    await asyncio.wait({watching})  # it may be inside receive(): nobody else may read meanwhile
    if not watching.cancelled():
        watching.exception()  # retrieved: a broken connection counts as a client gone
    if acquiring.done():
        return acquiring.result()
    _abandon(acquiring)
    metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()
    return None


def _abandon(acquiring: asyncio.Future[Ticket]) -> None:
    if acquiring.cancel():  # still queued: Admission.acquire gives the place back
        return
    if not acquiring.cancelled() and acquiring.exception() is None:
        acquiring.result().release()  # admitted meanwhile, but nobody will use the slot
