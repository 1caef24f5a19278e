"""Helpers for the serving tests: small real models and a real server process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

PY = sys.executable


def export_tf_models(root: str) -> None:
    """``digits/1``, ``digits/2`` (Keras, 8x8x1 -> 10 softmax, different weights),
    ``flat/1`` (64 features -> 10) and ``echo/1`` (a string model: text -> length, upper_bytes) in TF Serving's layout."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    for version, seed in ((1, 0), (2, 1)):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1), name="pixels"),
                keras.layers.Flatten(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.export(os.path.join(root, "digits", str(version)), verbose=False)

    keras.utils.set_random_seed(2)
    flat = keras.Sequential(
        [keras.Input((64,), name="features"), keras.layers.Dense(10, activation="softmax")]
    )
    flat.export(os.path.join(root, "flat", "1"), verbose=False)

    class Echo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            return {"length": tf.strings.length(text), "upper_bytes": tf.strings.upper(text)}

    echo = Echo()
    tf.saved_model.save(
        echo, os.path.join(root, "echo", "1"), signatures={"serving_default": echo.serve}
    )


def digits_inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 8, 8, 1), dtype=np.float32)


@contextmanager
def server(
    model_dir: str, tmp: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> Iterator[str]:
    """``python -m shipyard.serving`` on a free port; yields its URL once InService."""
    state = os.path.join(tmp, f"state-{time.monotonic_ns()}.json")
    log = open(os.path.join(tmp, "server.log"), "ab")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [PY, "-m", "shipyard.serving", model_dir, "--port", "0", "--state-file", state, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            data = _read_state(state)
            if data.get("status") == "InService":
                break
            if data.get("status") == "Failed" or proc.poll() is not None:
                raise RuntimeError(f"server failed: {data.get('failure_reason')}")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.1)
        yield f"127.0.0.1:{data['port']}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


def _read_state(path: str) -> dict[str, Any]:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def call(
    address: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, str, bytes]:
    """One HTTP request; (status, content type, body)."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def torchscript_archive(
    root: str, features: int = 4, outputs: int = 3, extra: dict[str, str] | None = None
) -> tuple[str, Any]:
    """A TorchScript Linear model as model.tar.gz (plus ``extra`` files, name -> text);
    returns (archive path, the module for in-process predictions)."""
    import tarfile

    import torch

    torch.manual_seed(0)
    net = torch.nn.Linear(features, outputs).eval()
    os.makedirs(root, exist_ok=True)
    torch.jit.save(torch.jit.script(net), os.path.join(root, "model.pt"))
    for name, text in (extra or {}).items():
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "w") as fh:
            fh.write(text)
    archive = root.rstrip("/") + ".tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name)
    return archive, net


def server_processes(marker: str) -> list[Any]:
    """Live processes whose command line mentions ``marker`` (an endpoint directory)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(
                proc.info["cmdline"] or []
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found
