"""The HTTP side of `tkp serve`: a FastAPI app that hands every `/v1/...` request to
pipelines/serving/model_server.py, and the uvicorn server that runs it (for the CLI and for tests,
in a
thread of its own)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from components.base.errors import ActionableError
from pipelines.serving import batching, metrics
from pipelines.serving.batching import BatchingParameters
from pipelines.serving.model_server import ModelManager, handle

DEFAULT_PORT = 8501  # TF Serving's --rest_api_port default
DEFAULT_MAX_REQUEST_MB = 32


class _TooLarge(Exception):
    pass


class ServeError(ActionableError, RuntimeError):
    """The server cannot start; the message says what to change."""


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused past `limit` bytes without reading the rest of it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _TooLarge(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


def _json(status: int, payload: dict) -> Response:
    # allow_nan: TF Serving writes NaN and Infinity as bare words (json_tensor.cc WriteDecimal).
    return Response(json.dumps(payload, allow_nan=True), status, media_type="application/json")


def create_app(manager: ModelManager, max_request_bytes: int) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    # Every /v1/ path, in any case, as TF Serving's kPathRegex `(?i)/v1/.*`.
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]

    @app.api_route("/{prefix:path}", methods=methods)
    async def tf_serving_api(request: Request, prefix: str) -> Response:
        if "/" + prefix == metrics.PATH and request.method == "GET":  # an exact path, as TF's
            return Response(manager.metrics.exposition(), media_type=metrics.CONTENT_TYPE)
        if not prefix.lower().startswith("v1/"):
            return Response(status_code=404)
        try:
            body = await _body(request, max_request_bytes)
        except _TooLarge as e:
            # TF Serving sets no limit; a 413 in its error shape keeps one client from
            # exhausting the memory of a shared local server.
            return _json(413, {"error": f"Request body of {e.args[0]} bytes or more is larger "
                               f"than this server's limit of {max_request_bytes} bytes "
                               "(tkp serve --max-request-mb)."})  # fmt: skip
        # Inference runs in a worker thread: TensorFlow releases the GIL, requests overlap.
        status, payload = await run_in_threadpool(
            handle, manager, request.method, request.url.path, body
        )
        return _json(status, payload)

    return app


@dataclass
class RunningServer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    # log_config=None: uvicorn's lines go through logging (the command's log file).
    return uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                          timeout_graceful_shutdown=5)  # fmt: skip


def start_in_thread(
    manager: ModelManager,
    host: str = "127.0.0.1",
    port: int = 0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_MB << 20,
) -> RunningServer:
    """Starts the server in a thread and returns once it accepts connections."""
    if port == 0:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    server = uvicorn.Server(_config(create_app(manager, max_request_bytes), host, port))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ServeError(f"the model server could not listen on {host}:{port} (is the port "
                             "in use? the log says why): choose another with --port")  # fmt: skip
        time.sleep(0.05)
    return RunningServer(f"http://{host}:{port}", server, thread)


def serve_forever(manager: ModelManager, host: str, port: int, max_request_bytes: int,
                  say: Callable[[str], None]) -> None:  # fmt: skip
    """`tkp serve`: loads the served version, then answers until interrupted."""
    manager.on_change = say
    say(f"Mirroring {manager.source} into {manager.cache_dir} ...")
    if manager.batcher is not None:
        say(f"Batching: {manager.batcher.parameters.describe()}.")
    manager.poll()
    if manager.current is None and not manager.states:
        say(f"No version of {manager.model_name!r} is pushed yet: waiting for one (checking "
            f"every {manager.poll_seconds:g} s).")  # fmt: skip
    manager.start()
    try:
        # In a thread, so that uvicorn leaves the signals to the CLI: SIGTERM and Ctrl-C end
        # in the CLI's clean-up, which stops the server and the poller below.
        running = start_in_thread(manager, host, port, max_request_bytes)
        base = f"{running.url}/v1/models/{manager.model_name}"
        say(f"TF Serving REST API at {base} (status), {base}:predict, :classify, :regress, "
            f"/metadata, /labels/<label>...; metrics at {running.url}{metrics.PATH}. "
            "Ctrl-C stops.")  # fmt: skip
        try:
            while running.thread.is_alive():
                running.thread.join(0.5)
            raise ServeError("the HTTP server stopped on its own; the log says why")
        finally:
            running.stop()
    finally:
        manager.stop()


def batching_of(args) -> BatchingParameters | None:
    """`--enable-batching` and `--batching-parameters-file` as TF Serving's two flags
    (model_servers/server.cc): a file without the switch is refused; the switch alone takes
    TF Serving's defaults."""
    if args.batching_parameters_file and not args.enable_batching:
        raise ServeError("--batching-parameters-file is set without --enable-batching (TF "
                         "Serving refuses that too): add --enable-batching")  # fmt: skip
    if not args.enable_batching:
        return None
    return batching.load_parameters(args.batching_parameters_file)


def cache_dir_for(work_dir: Path, model_name: str) -> Path:
    return work_dir / "serving" / model_name
