"""``ssr-lab``: world | eval | compare | train (the research lab beside the server).

Each module holds one family of commands (``world``, ``evaluate``, ``train``, ``probes``) and imports
what it runs only when it runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import typer

from ssr_lab.cli.evaluate import compare_command, eval_command
from ssr_lab.cli.probes import train_probe_command, train_probe_features_command
from ssr_lab.cli.train import train_app
from ssr_lab.cli.world import world_app

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The ssr-server lab: the benchmark world, evaluation and training.")
app.add_typer(world_app, name="world")
app.command("eval")(eval_command)
app.command("compare")(compare_command)
train_app.command("probe")(train_probe_command)
train_app.command("probe-features")(train_probe_features_command)
app.add_typer(train_app, name="train")


def main() -> None:
    app(prog_name="ssr-lab")
