"""``ssr-server``: serve | ask | infer | loadtest | bench | runs | sglang-launch | tiny-model.

The command table is here; each module holds one family of commands (``serving``, ``batch``, ``bench``)
and imports what it runs only when it runs, so ``--help`` stays fast. The lab's commands (world, eval,
compare, train) are ``ssr-lab``'s.
"""

from __future__ import annotations

import typer

from ssr_server.cli.batch import infer
from ssr_server.cli.bench import bench_app
from ssr_server.cli.runs import runs_app
from ssr_server.cli.serving import ask, loadtest, serve, sglang_launch, tiny_model

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inference server for small multimodal search agents that reason by selection.")
app.command()(serve)
app.command()(ask)
app.command()(infer)
app.command()(loadtest)
app.add_typer(bench_app, name="bench")
app.add_typer(runs_app, name="runs")
app.command("sglang-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    sglang_launch)
app.command("tiny-model")(tiny_model)


def main() -> None:
    app(prog_name="ssr-server")
