"""The `bench` command line: the only place that parses flags and prints for humans.

Each command group lives in its own module of this package and registers itself on `app`.
User-caused errors (`model.errors.ModelError`, `bench.errors.BenchError`) become one line on stderr
and exit code 2; nothing a user can cause ends in a traceback.
"""

from __future__ import annotations

import sys

import typer

from bench.cli.root import app, fail  # noqa: E402,F401  (re-exported: `bench.cli.app`, `bench.cli.fail`)


def _register(argv: list[str]) -> None:
    # Imported for their side effect: each module adds its commands to `app`. `bench gpu-run` registers its module
    # alone: the prepared run's parent process must not import jax, the engine or the server (the GPU image lacks
    # some of what the other command modules import); its steps import those in their own processes.
    if argv[:1] == ["gpu-run"]:
        from bench.cli import gpurun_cmds  # noqa: F401

        return
    from bench.cli import (
        ab_cmds,  # noqa: F401
        fleet_cmds,  # noqa: F401
        gpurun_cmds,  # noqa: F401
        kernel_cmds,  # noqa: F401
        model_cmds,  # noqa: F401
        peer_cmds,  # noqa: F401
        profile_cmds,  # noqa: F401
        report_cmds,  # noqa: F401
        serve_cmds,  # noqa: F401
        sweep_cmds,  # noqa: F401
    )


def _cli_error_kind(exc: BaseException) -> str | None:
    """"usage" for a command-line parsing error, "abort" for an aborted prompt, None otherwise.

    typer >= 0.22 carries its own copy of click (`typer._click`) whose exceptions are not click's, and older
    typer raises click's; both are recognised, so a bad flag value is one line whichever is installed (the GPU
    machine's preinstalled typer may be either).
    """
    usage: list[type] = []
    abort: list[type] = [typer.Abort]
    try:
        import click

        usage.append(click.exceptions.ClickException)
        abort.append(click.exceptions.Abort)
    except ImportError:
        pass
    try:
        from typer._click.exceptions import ClickException as TyperClickException

        usage.append(TyperClickException)
    except ImportError:
        pass
    if isinstance(exc, tuple(abort)):
        return "abort"
    if isinstance(exc, tuple(usage)):
        return "usage"
    return None


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is a device allocation failure: jax's runtime error carrying XLA's RESOURCE_EXHAUSTED (an
    out-of-memory error on a TPU or GPU), which a sweep cannot foresee exactly (the fit check keeps a stated
    reserve, docs/method.md "Where a model fits")."""
    return type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and "RESOURCE_EXHAUSTED" in str(exc)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `bench` console script; exit code 2 on a user error, never a traceback for one."""
    from bench.errors import BenchError
    from model.errors import ModelError

    _register(sys.argv[1:] if argv is None else argv)
    try:
        # Non-standalone: click returns an Exit's code instead of raising; prog_name keeps messages saying `bench`
        # under `python -m bench` too.
        rc = app(args=argv, prog_name="bench", standalone_mode=False)
    except (BenchError, ModelError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click's own usage errors arrive here in non-standalone mode
        kind = _cli_error_kind(exc)
        if kind == "usage":
            ctx = getattr(exc, "ctx", None)
            hint = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
            message = exc.format_message().rstrip(".")
            if message:  # empty for `bench` alone: the help text was already printed
                typer.echo(f"error: {message}{hint}", err=True)
            sys.exit(2)
        if kind == "abort":
            typer.echo("aborted", err=True)
            sys.exit(130)
        if _out_of_memory(exc):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            typer.echo(f"error: the device ran out of memory ({first}); "
                       "pick a lighter --quant, fewer --inputs or a smaller --batch (bench checkpoint "
                       "inspect --quant SET lists where a model fits)", err=True)  # fmt: skip
            sys.exit(1)
        raise
    if isinstance(rc, int) and rc:
        sys.exit(rc)
