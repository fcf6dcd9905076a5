"""`distill serve teacher`: a vLLM server for `teacher.engine=server`, with the flags it needs."""

from __future__ import annotations

import os
from typing import Annotated

import typer

serve_app = typer.Typer(
    help="Serve models for the `server` engine (vLLM, its own environment).", no_args_is_help=True
)


def address_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (one line), checked before vLLM starts:
    a port outside 1-65535, an address this machine does not have, a port already taken."""
    import socket

    if not 1 <= port <= 65535:
        return f"--port {port}: a TCP port is 1-65535"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--host {host}: not an address of this machine ({exc.strerror or exc})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as exc:
            return f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
    return None


@serve_app.command(
    "teacher",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Start `vllm serve` for a teacher (zoo:<name>, a path or a hub id) and print the run override "
    "to use it. Trailing arguments go to `vllm serve` as they are.",
)
def teacher(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="zoo:<name>, a local path or a hub id")] = "zoo:teacher",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    domain: Annotated[str, typer.Option(help="domain whose zoo models to build (zoo: names only)")] = "rlve",
    precision: Annotated[str, typer.Option(help="auto | fp32 | bf16 | fp16")] = "auto",
    max_model_len: Annotated[int | None, typer.Option(help="context length (default: the model's)")] = None,
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="share of (GPU or, on CPU, KV-cache) memory vLLM may take")
    ] = 0.1,
    threads: Annotated[
        int | None,
        typer.Option(
            help="CPU only: OpenMP threads of the server, its engine in one process (default: vLLM's own)"
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the command and exit")] = False,
) -> None:
    from distill.cli.common import fail
    from distill.config import domain_config
    from distill.engines.vllm_server import (
        DTYPES,
        ServeOptions,
        find_vllm,
        missing_vllm_message,
        serve_command,
    )
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    if precision not in DTYPES:
        raise fail(f"--precision {precision!r}: one of {', '.join(DTYPES)}")
    if problem := address_problem(host, port):
        raise fail(problem)
    vllm = find_vllm()
    if vllm is None:
        raise fail(missing_vllm_message())
    try:
        path = resolve_model(model, domain_config(domain), get_settings())
    except (KeyError, ValueError) as exc:
        raise fail(f"--model {model}: {exc}") from None
    opts = ServeOptions(
        host=host,
        port=port,
        precision=precision,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        extra=list(ctx.args),
    )
    cmd = serve_command(vllm, path, opts)
    typer.echo(" ".join(cmd))
    if dry_run:
        return
    typer.echo(
        f"teacher server: use it with  distill run ... teacher.name={model} teacher.engine=server "
        f"teacher.url=http://{host}:{port}",
        err=True,
    )
    from distill.engines.vllm_server import serve_env

    # Replace this process: Ctrl-C and signals go straight to vLLM.
    os.execvpe(cmd[0], cmd, serve_env(threads))
