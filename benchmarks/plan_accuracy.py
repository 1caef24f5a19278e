"""How well ``shipyard plan`` predicts: real jobs on emulated networks vs the model (issue 29).

    .venv/bin/python benchmarks/plan_accuracy.py [--quick] [--steps 12] [--batch 8]

The tutorials' CIFAR-10 CNN (1.25 M parameters, 5 MB of gradients per step) trains as
shipyard.ps parameter servers and as Horovod (Open MPI), each instance's link shaped with
the ``shipyard:network`` tag to 100 Mbit/s and 1 Gbit/s, at 2, 3 and 4 instances. The
planner is given one 2-instance run per distribution, read exactly as ``shipyard plan``
reads a job (:func:`shipyard.planner.profile.from_describe`), and every shaped run is
predicted from it and compared with what it measured. Two references, each with its own
RESULT line:

- ``unshaped`` (the headline, ``RESULT plan_accuracy``): 2 instances on this machine's
  memory-speed network, what a user's job is when ``shipyard plan`` is asked about
  instance types; all 12 shaped runs are predictions;
- ``100mbit`` (``RESULT plan_accuracy_100mbit_reference``): 2 instances at 100 Mbit/s,
  whose compute is the step less the predicted communication; the other 10 are
  predictions.

Measured: worker steps per second = workers / the mean over hosts of each host's median
seconds per step (timed by the script after a warm-up, so job start-up is not counted;
the median, so that a step another process on this shared machine delayed does not
count). Every instance runs on this machine, so the predictions take its cores as a
shared host (``Inputs.host_cores``, ``shipyard plan --shared-host``);
``--no-shared-host`` predicts as if each instance had cores of its own. ``--save DIR``
keeps every run's describe output and ``--replay DIR`` predicts them again.

Unmodified scripts (issue 39, ``--cases unmodified``; ``all`` runs both sets): the
project's own examples, run as written, with no step-time metric declared, so the planner
reads the step time shipyard measured itself (describe's ``Shipyard.StepTiming``) and
the gradient bytes shipyard counted (DDP's buckets, Horovod's reduction; a parameter
server job's placement report):

- ``keras_ps``: ``examples/tensorflow/cifar10_ps.py``, Keras ``fit`` under TensorFlow's
  ParameterServerStrategy (the coordinator's epochs are timed; planned as the coordinator
  dispatches, ``planner/coordinator.py``; each run prints how many steps each worker ran);
- ``horovod_keras``: ``examples/horovod/keras3_mnist.py``, ``import horovod.tensorflow.keras``;
- ``ddp``: ``examples/pytorch/ddp_cnn.py`` under ``torch_distributed`` (gloo).

Measured there: worker steps per second = workers / shipyard's median step (warm-up
excluded), the same reading the planner makes of the reference.

Prints one line per run and ends with
``RESULT plan_accuracy median_abs_err=.. max_abs_err=.. runs=..`` (relative errors).
``--quick``: 100 Mbit/s only, 2 and 3 instances.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result

CNN = r'''
import os, time
import torch
from torch import nn
torch.set_num_threads(1)


def tutorial_cnn():
    """The SageMaker Keras CIFAR-10 tutorial's model, in torch."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(64 * 6 * 6, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))


STEPS, BATCH, WARMUP = int(os.environ["STEPS"]), int(os.environ["BATCH"]), 3
'''

PS_SCRIPT = (
    CNN
    + r"""
import shipyard.ps.torch as ps_torch
rank = int(os.environ["SHIPYARD_PS_RANK"])
torch.manual_seed(rank)
x, y = torch.rand(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
torch.manual_seed(0)
model = tutorial_cnn()
opt = ps_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                    named_parameters=model.named_parameters())


def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(WARMUP):
    step()
times = []
for _ in range(STEPS):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
print(f"step_time={sorted(times)[len(times) // 2]}", flush=True)
opt.close()
"""
)

HVD_SCRIPT = (
    CNN
    + r"""
import horovod.torch as hvd
hvd.init()
torch.manual_seed(hvd.rank())
x, y = torch.rand(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
torch.manual_seed(0)
model = tutorial_cnn()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(WARMUP):
    step()
times = []
for _ in range(STEPS):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
print(f"step_time={sorted(times)[len(times) // 2]}", flush=True)
"""
)

GRADIENT_BYTES = 4 * 1_250_858  # the CNN's parameters, float32
DISTRIBUTIONS = {
    "shipyard_ps": ("ps.py", {"parameter_server": {"enabled": True}}),
    "horovod": ("hvd.py", {"mpi": {"enabled": True, "processes_per_host": 1}}),
}


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REUSE = False  # --reuse: a run saved by an interrupted --save is read, not run again
# the unmodified examples: framework, source dir, entry point, distribution,
# hyperparameters, channels ("digits" or "cifar": made by the examples' data scripts),
# and the collective the planner models (None: a parameter-server job)
UNMODIFIED = {
    "keras_ps": (
        "tensorflow",
        "tensorflow",
        "cifar10_ps.py",
        {"parameter_server": {"enabled": True}},
        {"epochs": 3, "steps_per_epoch": 16, "batch_size": 16},
        "cifar",
        None,
    ),
    "horovod_keras": (
        "tensorflow",
        "horovod",
        "keras3_mnist.py",
        {"mpi": {"enabled": True, "processes_per_host": 1}},
        {"epochs": 2, "warmup-epochs": 1},
        "digits",
        "reduce_bcast",  # Open MPI's allreduce for 2-4 ranks (see BENCHMARKS.md)
    ),
    "ddp": (
        "pytorch",
        "pytorch",
        "ddp_cnn.py",
        {"torch_distributed": {"enabled": True}},
        {"epochs": 2},
        "digits",
        "ring",  # gloo's allreduce
    ),
}


def make_data(tmp: Path) -> dict[str, dict[str, str]]:
    """The examples' inputs, made by their own data scripts (nothing downloaded)."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / "data" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    digits = tmp / "digits"
    digits.mkdir()
    load("make_digits").write_digits(str(digits))
    cifar = tmp / "cifar"
    make = load("make_cifar_tfrecords")
    for split, n, seed in (("train", 256, 1), ("eval", 32, 2)):
        (cifar / split).mkdir(parents=True)
        make.write(str(cifar / split / f"{split}.tfrecords"), n, seed)
    return {
        "digits": {"training": str(digits)},
        "cifar": {"train": str(cifar / "train"), "eval": str(cifar / "eval")},
    }


def run(
    session,
    src,
    kind: str,
    rate: str,
    n: int,
    steps: int,
    batch: int,
    keep: Path | None,
    data: dict[str, dict[str, str]] | None = None,
) -> dict:
    """One job; returns its describe output (read from ``keep`` when replaying, written
    there when recording: ``--save``/``--replay`` re-predict recorded runs offline)."""
    import shipyard

    name = f"{kind.replace('_', '-')}-{rate}-{n}"
    if keep is not None and (session is None or (REUSE and (keep / f"{name}.json").exists())):
        return json.loads((keep / f"{name}.json").read_text())
    tags = [] if rate == "unshaped" else [{"Key": "shipyard:network", "Value": rate}]
    if kind in UNMODIFIED:
        framework, folder, entry, distribution, hps, channels, _ = UNMODIFIED[kind]
        cls = shipyard.TensorFlow if framework == "tensorflow" else shipyard.PyTorch
        est = cls(
            entry_point=entry,
            source_dir=str(EXAMPLES / folder),
            instance_count=n,
            instance_type="local",
            session=session,
            distribution=distribution,
            hyperparameters=hps,
            tags=tags,
        )
        est.fit((data or {}).get(channels), job_name=name, logs=False)
    else:
        entry, distribution = DISTRIBUTIONS[kind]
        est = shipyard.PyTorch(
            entry_point=entry,
            source_dir=str(src),
            instance_count=n,
            instance_type="local",
            session=session,
            distribution=distribution,
            environment={"STEPS": str(steps), "BATCH": str(batch)},
            metric_definitions=[{"Name": "step_time", "Regex": r"step_time=([0-9.e-]+)"}],
            tags=tags,
        )
        est.fit(job_name=name, logs=False)
    desc = session.control.describe(name)
    desc["LoadAverage"] = os.getloadavg()[0]  # this shared machine's, as the job ended
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}.json").write_text(json.dumps(desc, default=str))
    return desc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--only", choices=sorted([*DISTRIBUTIONS, *UNMODIFIED]), help="one distribution"
    )
    parser.add_argument(
        "--cases",
        choices=("tutorial", "unmodified", "all"),
        default="all",
        help="the tutorial CNN's scripts (timed by the script), the unmodified examples "
        "(timed by shipyard), or both",
    )
    parser.add_argument(
        "--no-shared-host", action="store_true", help="predict as if each instance had its cores"
    )
    parser.add_argument("--save", type=Path, help="write each run's describe output here")
    parser.add_argument("--replay", type=Path, help="re-predict the runs saved in this folder")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --save: runs already saved there are not run again",
    )
    args = parser.parse_args()
    global REUSE
    REUSE = args.reuse
    import shipyard
    from shipyard.planner import model
    from shipyard.planner.profile import from_describe
    from shipyard.sandbox import shaping

    rates = ["100mbit"] if args.quick else ["100mbit", "1gbit"]
    counts = [2, 3] if args.quick else [2, 3, 4]
    errors: dict[str, list[float]] = {"unshaped": [], rates[0]: []}
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        src = Path(tmp, "src")
        src.mkdir()
        (src / "ps.py").write_text(PS_SCRIPT)
        (src / "hvd.py").write_text(HVD_SCRIPT)
        session = None if args.replay else shipyard.Session(home=str(Path(tmp, "home")))
        keep = args.replay or args.save
        data = None if args.replay else make_data(Path(tmp))
        kinds = {
            "tutorial": list(DISTRIBUTIONS),
            "unmodified": list(UNMODIFIED),
            "all": [*DISTRIBUTIONS, *UNMODIFIED],
        }[args.cases]
        for kind in [args.only] if args.only else kinds:
            # the references: 2 instances unshaped (what a user's job is: `shipyard plan`'s
            # usual input) and 2 instances at the lowest rate (the compute is then the step
            # less the predicted communication)
            runs = {
                (r, 2): run(session, src, kind, r, 2, *shape_args(args), keep, data)
                for r in ("unshaped", rates[0])
            }
            given = inputs_for(kind, runs[("unshaped", 2)])
            if not args.no_shared_host:  # every instance runs on this machine's cores
                given = replace(given, host_cores=float(len(os.sched_getaffinity(0))))
            refs = {r: from_describe(runs[(r, 2)], given) for r in errors}
            for r, ref in refs.items():
                print(
                    f"{kind}: reference 2 x {r} (load {runs[(r, 2)].get('LoadAverage', 0):.0f}): "
                    f"{ref.step_s * 1e3:.0f} ms/step, compute "
                    f"{ref.profile.compute_s * 1e3:.0f} ms ({ref.sources['compute_time']})",
                    flush=True,
                )
            for rate in rates:
                shape = shaping.parse(rate, "local")
                link = model.Link(rate, shape.rate_bytes_per_s, framing=model.TCP_FRAMING)
                for n in counts:
                    desc = runs.get((rate, n)) or run(
                        session, src, kind, rate, n, *shape_args(args), keep, data
                    )
                    measured = n / from_describe(desc, given).step_s
                    said = []
                    for r, ref in refs.items():
                        if (rate, n) == (r, 2):  # a reference is fitted, not predicted
                            said.append(f"[{r} ref: the reference]")
                            continue
                        row = model.predict(ref.profile, link, n)
                        err = abs(row.steps_per_s - measured) / measured
                        errors[r].append(err)
                        said.append(
                            f"[{r} ref: {row.steps_per_s:6.2f} ({row.bottleneck}), {err:5.1%}]"
                        )
                    if kind == "horovod":
                        ring = model.predict(
                            replace(refs["unshaped"].profile, allreduce="ring"), link, n
                        )
                        err = abs(ring.steps_per_s - measured) / measured
                        said.append(f"[ring model: {ring.steps_per_s:6.2f}, {err:5.1%}]")
                    print(
                        f"  {kind:12} {rate:8} n={n}: measured {measured:6.2f} steps/s "
                        f"(load {desc.get('LoadAverage', 0):.0f}), predicted " + " ".join(said),
                        flush=True,
                    )
                    if kind == "keras_ps":
                        print(f"    {worker_steps(desc)}", flush=True)
    for r, errs in errors.items():
        result(
            "plan_accuracy" if r == "unshaped" else f"plan_accuracy_{r}_reference",
            reference=f"2x{r}",
            median_abs_err=statistics.median(errs),
            max_abs_err=max(errs),
            runs=len(errs),
        )


def worker_steps(desc: dict) -> str:
    """Which worker ran how many of a ParameterServerStrategy job's steps: each step
    pulls every ps' trainable variables, so a worker's pulled bytes over them count its
    steps (the relays do not see the gradients; warm-up epoch included)."""
    from shipyard.planner import coordinator

    report = (desc.get("Shipyard") or {}).get("DistributionReport") or {}
    traffic = report.get("traffic") or {}
    _, loads = coordinator.read_placement(
        report.get("placement") or [], int(report.get("num_shards") or 0)
    )
    hot = max(range(len(loads)), key=lambda j: loads[j], default=None)
    if hot is None or not loads[hot]:
        return "steps per worker: no placement report"
    counts = [
        f"{peer} {row[hot] / loads[hot]:.1f}"
        for peer, row in zip(traffic.get("peers") or [], traffic.get("bytes_from_shard") or [])
        if peer.startswith("worker:")
    ]
    return f"steps per worker (pulls of ps:{hot}'s {loads[hot]:,.0f} B): " + ", ".join(counts)


def shape_args(args) -> tuple[int, int]:
    return args.steps, args.batch


def inputs_for(kind: str, reference: dict):
    """What the planner is given besides the job: the collective it models and, for an
    allreduce job, the gradient bytes (the tutorial CNN's known size; for an unmodified
    script what shipyard counted per step in the reference run)."""
    from shipyard.planner.profile import Inputs

    if kind == "horovod":
        # Open MPI's default allreduce for 2-4 ranks is reduce + broadcast (measured:
        # see BENCHMARKS.md); the ring's prediction is printed beside it
        return Inputs(gradient_bytes=GRADIENT_BYTES, allreduce="reduce_bcast")
    if kind in UNMODIFIED and UNMODIFIED[kind][6] is not None:
        timing = (reference.get("Shipyard") or {}).get("StepTiming") or {}
        counted = timing.get("BytesPerStep")
        if not counted:
            raise SystemExit(f"{kind}: shipyard counted no gradient bytes in {timing}")
        return Inputs(gradient_bytes=float(counted), allreduce=UNMODIFIED[kind][6])
    return Inputs()


if __name__ == "__main__":
    main()
