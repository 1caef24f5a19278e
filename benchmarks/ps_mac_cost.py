"""CPU per byte of the per-byte work of a shipyard.ps push_pull, one piece at a time.

Why: a 100 MB push_pull is bound by per-byte passes (kernel copies, the MAC both ways,
the update on the shard; BENCHMARKS.md issue 17). This prices the choices one process
can make per byte, with CPU time (``time.process_time``) so a busy machine disturbs it
little, on a 32 MiB buffer (larger than the caches here):

* ``gmac_aad``: AES-256-GCM with the payload as associated data and nothing encrypted,
  streamed into a GCM encryptor (what ``wire.Signer._gmac`` does for a large message);
* ``gcm_encrypt``: AES-256-GCM encrypting the payload into a preallocated buffer
  (``update_into``), the alternative of sending ciphertext;
* ``gcm_decrypt``: the receiver's side of that, decrypting into a preallocated buffer;
* ``memcpy``: one copy (``np.copyto``), the unit the others are measured in;
* ``sgd_whole`` / ``sgd_blocked``: the SGD step ``param += -lr * grad`` as two numpy
  passes over whole arrays, and the same two passes block by block
  (``optimizers.add_scaled``).

Ends with ``RESULT ps_mac_cost gmac_aad_gbps= gcm_encrypt_gbps= gcm_decrypt_gbps=
memcpy_gbps= sgd_whole_gbps= sgd_blocked_gbps=`` (GB of payload per CPU second, median
of ``--repeats``).

Run:  python benchmarks/ps_mac_cost.py [--mb 32] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result
from shipyard.ps.optimizers import add_scaled

KEY = algorithms.AES(os.urandom(32))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    n = args.mb << 20
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, n, dtype=np.uint8)
    dst = np.empty(n + 16, dtype=np.uint8)  # update_into wants room for one more block
    view, out = memoryview(src), memoryview(dst)
    param = rng.standard_normal(n // 4).astype(np.float32)
    grad = rng.standard_normal(n // 4).astype(np.float32)
    tmp = np.empty_like(param)

    def gmac_aad() -> None:
        enc = Cipher(KEY, modes.GCM(os.urandom(12))).encryptor()
        enc.authenticate_additional_data(view)
        enc.finalize()

    def gcm_encrypt() -> None:
        enc = Cipher(KEY, modes.GCM(os.urandom(12))).encryptor()
        enc.update_into(view, out)
        enc.finalize()

    iv = os.urandom(12)
    enc = Cipher(KEY, modes.GCM(iv)).encryptor()
    cipher = np.empty(n + 16, dtype=np.uint8)
    enc.update_into(view, memoryview(cipher))
    enc.finalize()
    tag = enc.tag
    cview = memoryview(cipher)[:n]

    def gcm_decrypt() -> None:
        dec = Cipher(KEY, modes.GCM(iv, tag)).decryptor()
        dec.update_into(cview, out)
        dec.finalize()  # raises InvalidTag on a bad tag

    def memcpy() -> None:
        np.copyto(dst[:n], src)

    def sgd_whole() -> None:
        np.multiply(grad, -0.01, out=tmp)
        param.__iadd__(tmp)

    def sgd_blocked() -> None:
        add_scaled(param, grad, -0.01, tmp)

    def gbps(f: Callable[[], None]) -> float:
        f()  # warm: pages touched, code loaded
        runs = []
        for _ in range(args.repeats):
            c0 = time.process_time()
            f()
            runs.append(time.process_time() - c0)
        return round(n / max(statistics.median(runs), 1e-9) / 1e9, 2)

    figures = {
        f"{f.__name__}_gbps": gbps(f)
        for f in (gmac_aad, gcm_encrypt, gcm_decrypt, memcpy, sgd_whole, sgd_blocked)
    }
    for k, v in figures.items():
        print(f"{k[:-5]:<12} {v:6.2f} GB per CPU second", flush=True)
    result("ps_mac_cost", **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
