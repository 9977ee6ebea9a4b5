"""`eaglespec serve` on the command line: its flags and the command, apart from the app (server.py), so that
building the `eaglespec` parser does not import FastAPI, pydantic or uvicorn: every other command runs without
them (e.g. on a GPU box that has torch and transformers only). See docs/SERVER.md."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from eaglespec.serve import DEFAULT_MAX_MODEL_LEN

log = logging.getLogger("eaglespec.serve.server")


def register(subparsers: Any) -> None:
    """Add `eaglespec serve` to the `eaglespec` parser."""
    from eaglespec.flags import add_draft_args, add_model_args

    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (see docs/SERVER.md)")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: localhost only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: the model's name)")
    p.add_argument("--api-key", default=os.environ.get("EAGLESPEC_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every route but /health "
                        "(default: $EAGLESPEC_API_KEY; none = open)")
    p.add_argument("--max-batch-size", type=int, default=8, help="sequences decoded together, per engine")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a slot; more get 429")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"KV slots per sequence: prompt + max_tokens + draft slack (default: "
                        f"min({DEFAULT_MAX_MODEL_LEN}, the model's context))")
    p.add_argument("--seed", type=int, default=None, help="seed of the draft sampler (--draft-temperature > 0)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_draft_args(p)
    p.set_defaults(func=cmd_serve)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server listens beyond this machine without an API key (None otherwise)."""
    if api_key or host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        return None
    return (f"listening on {host} without an API key: anyone who can reach this interface can use the model; "
            f"pass --api-key (or set EAGLESPEC_API_KEY), or bind 127.0.0.1")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from eaglespec.serve.server import ServerConfig, create_app

    from eaglespec.flags import draft_options
    from eaglespec.runtime.loading import load_target
    from eaglespec.engine.calibrate import build_calibrated_proposer as build_proposer

    for flag, value, low in (("--max-batch-size", args.max_batch_size, 1), ("--max-queue", args.max_queue, 0),
                             ("--port", args.port, 0)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    opts = draft_options(args)  # refuse bad tree flags before the slow model load
    opts.dispatcher()
    t0 = time.perf_counter()
    target = load_target(args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                         int4_kernel=args.int4_kernel,
                         prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
    log.info("loaded %s (%s, %s) in %.1f s", target.name, target.model.precision, args.device, time.perf_counter() - t0)
    context = target.model.args.max_position_embeddings
    max_len = args.max_model_len or min(DEFAULT_MAX_MODEL_LEN, context)
    if not 1 < max_len <= context:
        raise ValueError(f"--max-model-len must be in [2, {context}] for this model, got {max_len}")
    proposer = build_proposer(target, opts)
    log.info("speculative decoding: %s", f"on, trees {proposer.dispatcher}" if proposer else "off (no draft head)")
    config = ServerConfig(served_model_name=args.served_model_name or target.name,
                          max_batch_size=args.max_batch_size, max_queue=args.max_queue, max_model_len=max_len,
                          api_key=args.api_key or None)
    app = create_app(target, proposer, config)
    if (warning := exposure_warning(args.host, config.api_key)) is not None:
        log.warning(warning)
    log.info("serving `%s` on http://%s:%d/v1", config.served_model_name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
