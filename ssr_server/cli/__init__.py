"""``ssr-server``: serve | ask | tiny-model | sglang-launch | bench | loadtest | world | infer | eval |
compare | train.

The command table is here; each module holds one family of commands (``serving``, ``bench``, ``world``,
``evaluate``, ``train``, ``probes``) and imports what it runs only when it runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import typer

from ssr_server.cli.bench import bench_app
from ssr_server.cli.evaluate import compare_command, eval_command, infer
from ssr_server.cli.probes import train_probe_command, train_probe_features_command
from ssr_server.cli.serving import ask, loadtest, serve, sglang_launch, tiny_model
from ssr_server.cli.train import train_app
from ssr_server.cli.world import world_app

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inference server for small multimodal search agents that reason by selection.")
app.command()(serve)
app.command()(ask)
app.command("tiny-model")(tiny_model)
app.command("sglang-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    sglang_launch)
app.add_typer(bench_app, name="bench")
app.command()(loadtest)
app.add_typer(world_app, name="world")
app.command()(infer)
app.command("eval")(eval_command)
app.command("compare")(compare_command)
train_app.command("probe")(train_probe_command)
train_app.command("probe-features")(train_probe_features_command)
app.add_typer(train_app, name="train")


def main() -> None:
    app(prog_name="ssr-server")
