"""ServerConfig: everything a server and its workers need, passed to workers as JSON."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

CONFIG_ENV = "SHIPYARD_SERVING_CONFIG"


@dataclass
class ServerConfig:
    model_dir: str
    port: int = 8080
    host: str = "127.0.0.1"
    workers: int = 1
    framework: str = "auto"  # auto | tensorflow | pytorch | python
    program: str | None = None  # inference.py in code/ (SAGEMAKER_PROGRAM)
    max_payload_mb: float = 6.0  # SAGEMAKER_MAX_PAYLOAD_IN_MB
    batch_size: int = 0  # dynamic batching: max rows per call; 0 = off
    batch_wait_ms: float = 2.0  # dynamic batching: longest wait for company
    threads: int = 0  # framework threads per worker; 0 = cores / workers
    state_file: str | None = None  # JSON status for whoever started the server

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        return cls(**json.loads(text))

    def threads_per_worker(self) -> int:
        """Framework threads per worker: its share of the cores, less one with dynamic
        batching, which is meant for load (the other core goes to parsing the next
        requests, in this worker or another). On 2 cores, 1 worker, batching 8, the
        digits CNN at c=8: 1 thread ~8800 req/s, 2 threads ~7400 (BENCHMARKS.md)."""
        if self.threads:
            return self.threads
        share = (os.cpu_count() or 1) // max(1, self.workers)
        return max(1, share - (1 if self.batch_size > 1 else 0))

    def execution_parameters(self) -> dict:
        """What GET /execution-parameters answers (the batch transform contract)."""
        return {
            "MaxConcurrentTransforms": max(1, self.workers) * (2 if self.batch_size else 1),
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": int(self.max_payload_mb),
        }
