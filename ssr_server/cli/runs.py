"""``ssr-server runs``: the run store from the command line (``export`` for training data)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from ssr_server.cli.common import make_settings

runs_app = typer.Typer(no_args_is_help=True, help="The run store: export stored runs.")


def _when(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise typer.BadParameter(f"not a date (ISO 8601) or unix seconds: {text!r}") from None


@runs_app.command("export")
def export(
    out: Annotated[Path, typer.Option(help="the JSONL file to write (one trajectory record a line)")],
    since: Annotated[str | None, typer.Option(help="runs started at or after (ISO 8601 or unix s)")] = None,
    until: Annotated[str | None, typer.Option(help="runs started before (ISO 8601 or unix s)")] = None,
    outcome: Annotated[str | None, typer.Option(help="only this outcome (answered, max_turns, ...)")] = None,
    status: Annotated[str | None, typer.Option(help="only this status (completed, failed, ...)")] = None,
    mode: Annotated[str | None, typer.Option(help="ssr | freeform")] = None,
    images: Annotated[bool, typer.Option(help="the input images inline, as data: URLs")] = True,
    store: Annotated[str | None, typer.Option(help="the store (default: SSR_RUN_STORE)")] = None,
) -> None:
    """Write finished stored runs as training trajectories (the record ``ssr-server infer`` writes)."""
    import asyncio

    from ssr_server.store import export as exporter
    from ssr_server.store.backends import open_store
    from ssr_server.store.records import STATUSES, RunFilter

    if status is not None and status not in STATUSES:
        raise typer.BadParameter(f"status must be one of {', '.join(STATUSES)}")
    where = RunFilter(status=status, mode=mode, outcome=outcome, since=_when(since),  # type: ignore[arg-type]
                      until=_when(until))

    async def main() -> int:
        opened = await open_store(make_settings(run_store=store))
        if opened is None:
            raise typer.BadParameter("the run store is off (SSR_RUN_STORE=off): nothing to export")
        try:
            tmp = out.with_name(f".{out.name}.part")
            with tmp.open("w", encoding="utf-8") as f:
                n = await exporter.export(opened, where, f, with_images=images)
            tmp.replace(out)  # a failed export never leaves half a file
            return n
        finally:
            await opened.close()

    n = asyncio.run(main())
    typer.echo(f"{n} runs written to {out}")
