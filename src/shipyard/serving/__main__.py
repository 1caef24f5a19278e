"""``python -m shipyard.serving MODEL_DIR``: run a model server in the foreground."""

from __future__ import annotations

import argparse
import sys

from shipyard.serving.config import ServerConfig


def parse(argv: list[str] | None = None) -> ServerConfig:
    """The server's command line (also an endpoint launcher's, shipyard.control.endpoint_box)."""
    p = argparse.ArgumentParser(prog="python -m shipyard.serving")
    p.add_argument("model_dir")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--framework", default="auto")
    p.add_argument("--program", default=None)
    p.add_argument("--max-payload-mb", type=float, default=6.0)
    p.add_argument("--batch-size", type=int, default=0)
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--state-file", default=None)
    a = p.parse_args(argv)
    return ServerConfig(
        model_dir=a.model_dir,
        port=a.port,
        host=a.host,
        workers=a.workers,
        framework=a.framework,
        program=a.program,
        max_payload_mb=a.max_payload_mb,
        batch_size=a.batch_size,
        batch_wait_ms=a.batch_wait_ms,
        threads=a.threads,
        state_file=a.state_file,
    )


def main(argv: list[str] | None = None) -> int:
    from shipyard.serving.server import serve

    return serve(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
