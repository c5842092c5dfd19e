"""The `bench` Typer application and the one-line failure helper, apart from the package's entry point
(`bench.cli.main`), so that the command modules, which register on `app`, do not import the package that imports
them."""

from __future__ import annotations

import typer

__all__ = ["app", "fail"]

app = typer.Typer(
    name="bench",
    help="Benchmark Gemma 4 on a pure-JAX engine: sweeps, profiles, reports, serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _commands() -> None:
    # A callback keeps `bench` a group of commands however many `_register` adds: typer runs a lone registered
    # command as the app itself, which would read `bench gpu-run OUTDIR`'s "gpu-run" as OUTDIR.
    pass


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: <message>` on stderr and return the `typer.Exit` to raise (exit code 2 by default)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
