"""The `rstar2` command. Every sub-command has `--help`.

This module only assembles: each group's commands live in a module of their own (``commands/``,
``sandbox/commands.py``, ``launch/commands.py``), and are added here in the order ``rstar2 --help``
lists them."""

from __future__ import annotations

import os

import typer

from .commands import analysis, model
from .commands.analysis import view_cmd
from .commands.rollouts import chat, eval_cmd
from .commands.servers import serve, vllm_cmd
from .commands.training import compare_cmd, demo, replay_cmd, train
from .commands.verify import verify
from .launch import commands as launch_commands
from .sandbox import commands as sandbox_commands

app = typer.Typer(
    help="rstar2: agentic RL for language models that reason with a Python tool.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sandbox_commands.app, name="sandbox")
app.add_typer(analysis.app, name="analyze")
app.add_typer(model.app, name="model")
app.command("launch")(launch_commands.launch)
app.command("launch-node", hidden=True)(launch_commands.launch_node)
app.command("verify")(verify)
app.command("serve")(serve)
app.command("vllm", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(vllm_cmd)
app.command("chat")(chat)
app.command("eval")(eval_cmd)
app.command("train")(train)
app.command("demo")(demo)
app.command("compare")(compare_cmd)
app.command("replay")(replay_cmd)
app.command("view")(view_cmd)


def main() -> None:  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
