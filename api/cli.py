"""The API's `tokenshop` commands: `serve` and `export-model`.

Each imports what it runs only when it runs, so `tokenshop --help` and billing's commands start
fast without the server or the export tool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from billing.cli import CliError

app = typer.Typer(rich_markup_mode=None, help="The OpenAI-compatible API and its models.")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
) -> None:
    """Serve the OpenAI-compatible API."""
    import uvicorn

    uvicorn.run(
        "api.main:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        proxy_headers=True,
        log_config=None,
    )


@app.command("export-model")
def export_model(
    source: Annotated[str, typer.Argument(help="A local transformers dir or a hub id.")],
    out: Annotated[Path, typer.Argument(help="The export dir to create (then add it to MODELS).")],
    quantize: Annotated[
        str | None,
        typer.Option(help="Quantize the weights: int8 or int4 (4x or ~7x less to read per token)."),
    ] = None,
    task: Annotated[
        str,
        typer.Option(
            help="chat (a causal LM) or embedding (a sentence-transformers model dir: int8 only)."
        ),
    ] = "chat",
) -> None:
    """Export a model to ONNX for serving (needs the `export` extra)."""
    from api.engine.export.embedding import export_embedding
    from api.engine.export.exporter import ExportFailed, ExportUnavailable
    from api.engine.export.exporter import export_model as export_chat

    if task not in ("chat", "embedding"):
        raise CliError(f"--task is chat or embedding, not {task!r}")
    export = export_embedding if task == "embedding" else export_chat
    try:
        result = export(source, out, quantize, progress=lambda line: typer.echo(line, err=True))
    except (ExportUnavailable, ExportFailed, FileExistsError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    typer.echo(result.path)
