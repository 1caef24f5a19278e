"""``python -m shipyard.tf.server``: one TensorFlow task of a job plus its instance's relays.

What every instance runs for the TensorFlow distributions:

* ``--serve``: a ``tf.distribute.Server`` for the task named in TF_CONFIG (a ps or a
  worker that only serves), bound to the task's private port. ``--cpu-only`` hides the
  GPUs, as SageMaker forces its parameter servers onto the CPU.
* ``--relay NAME=IP:PORT>IP:PORT``: byte-counting relays from the instance's public
  addresses to private ports (shipyard.runtime.traffic); they also answer the chief's
  request for the counters (job secret in ``SHIPYARD_JOB_SECRET``).

It runs until SIGTERM (the agent stops servers once the chief has ended) and exits at
once then: a TensorFlow server has no clean shutdown, and waiting for one is how
parameter servers come to outlive their jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from shipyard import settings
from shipyard.runtime.traffic import PeerNamer, Relay, TrafficBook

SECRET_ENV = "SHIPYARD_JOB_SECRET"


def log(message: str) -> None:
    sys.stdout.write(f"[shipyard-tf] {message}\n")
    sys.stdout.flush()


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Hold back native stderr (absl's pre-init INFO lines, CUDA probes) while TensorFlow
    starts; replay it if starting fails, so real errors are never hidden."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            tmp.seek(0)
            sys.stderr.write(tmp.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def parse_relay(text: str) -> tuple[str, tuple[str, int], tuple[str, int]]:
    name, _, spec = text.partition("=")
    listen, _, upstream = spec.partition(">")

    def addr(value: str) -> tuple[str, int]:
        host, _, port = value.rpartition(":")
        return host, int(port)

    return name, addr(listen), addr(upstream)


def start_server(task_type: str, task_index: int, cpu_only: bool):
    """Start this process's TensorFlow server from TF_CONFIG's cluster."""
    with quiet_stderr():
        from shipyard.runtime.tf_import import import_tensorflow

        tf = import_tensorflow()  # a server runs no Keras code: ~2 s less CPU to start

        cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
        config = tf.compat.v1.ConfigProto()
        if cpu_only:
            config.device_count["GPU"] = 0
        intra = settings.optional_integer("SHIPYARD_TF_INTRA_OP_THREADS")
        if intra:
            config.intra_op_parallelism_threads = intra
        inter = settings.optional_integer("SHIPYARD_TF_INTER_OP_THREADS")
        if inter:
            config.inter_op_parallelism_threads = inter
        return tf.distribute.Server(
            cluster,
            job_name=task_type,
            task_index=task_index,
            protocol="grpc",
            config=config,
            start=True,
        )


def write_failure(path: str | None, text: str) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def _asker(secret: str):
    """Names a peer in another instance by asking a relay of that instance (every task
    address of TF_CONFIG's cluster is a relay): its processes are not in this one's /proc."""
    if not secret:
        return None
    from shipyard.runtime.traffic import ask_who

    relays: dict[str, tuple[str, int]] = {}
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    except ValueError:
        return None
    for addresses in cluster.values():
        for address in addresses:
            ip, _, port = str(address).rpartition(":")
            if ip and port.isdigit():
                relays.setdefault(ip, (ip, int(port)))

    def ask(peer: tuple[str, int]) -> str | None:
        relay = relays.get(peer[0])
        return ask_who(relay, peer, secret) if relay is not None else None

    return ask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.tf.server")
    parser.add_argument("--name", required=True, help="this process in logs (ps:1)")
    parser.add_argument("--serve", action="store_true", help="run TF_CONFIG's task")
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--relay", action="append", default=[])
    parser.add_argument("--failure-file", default=None)
    args = parser.parse_args(argv)
    stop = threading.Event()
    # exit at once on SIGTERM: there is nothing to flush, and TF servers do not stop cleanly
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    from shipyard.runtime.resolver import HOSTS_ENV, decode

    host = settings.get("SHIPYARD_CURRENT_HOST") or "?"
    secret = settings.get(SECRET_ENV) or ""
    book = TrafficBook(PeerNamer(decode(settings.get(HOSTS_ENV) or ""), ask=_asker(secret)))

    def stats() -> dict:
        return dict(book.to_json(), host=host, name=args.name)

    relays = [
        Relay(name, listen, upstream, book, stats=stats if secret else None, secret=secret)
        for name, listen, upstream in map(parse_relay, args.relay)
    ]
    try:
        for relay in relays:
            relay.bind()
    except OSError as exc:
        text = (
            f"{exc.strerror}. Another process holds that port on {host}; pick free ports "
            "with distribution={'parameter_server': {'enabled': True, 'ports': {...}}} "
            "(or {'multi_worker_mirrored_strategy': {'enabled': True, 'port': N}})"
        )
        write_failure(args.failure_file, text)
        log(text)
        return 1
    for relay in relays:
        relay.start()
    book.start_sampling()
    if args.serve:
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        started = time.monotonic()
        try:
            start_server(task["type"], int(task["index"]), args.cpu_only)
        except Exception as exc:  # noqa: BLE001 - any start failure becomes the failure file
            address = json.loads(os.environ["TF_CONFIG"])["cluster"][task["type"]][task["index"]]
            text = (
                f"{args.name}: TensorFlow server at {address} did not start: "
                f"{type(exc).__name__}: {exc}"
            )
            write_failure(args.failure_file, text)
            log(text)
            return 1
        log(f"{args.name} serving on {host} ({time.monotonic() - started:.1f}s to start)")
    if relays:
        log(
            f"{args.name}: relays "
            + ", ".join(f"{r.name} {r.listen[0]}:{r.listen[1]}" for r in relays)
        )
    while not stop.wait(3600):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
