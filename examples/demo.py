"""`make demo`: the tutorials' parameter-server flow, end to end, on this machine.

The question SageMaker users keep asking about parameter servers: "my script never
mentions a strategy or a device, yet two instances ran faster: where do the variables
live, and what goes between the servers?" This demo answers it:

1. CIFAR-10-shaped TFRecords are generated (the tutorials' record format; nothing downloads);
2. the tutorials' Keras CNN script, as users wrote it (no strategy), runs with
   ``distribution={'parameter_server': {'enabled': True}}`` on 2 instances: shipyard's
   report says nothing was placed on a parameter server (only algo-1, the chief, runs the
   script in the TF2 layout, so it trained the model alone; algo-2 only served);
3. the same CNN with ParameterServerStrategy on 2 instances: every variable's server,
   the imbalance, the worker x server traffic;
4. before you pay, "ml.p2.xlarge or ml.p2.8xlarge (networks about eight times apart), and
   how many?": the CNN (in torch, through shipyard.ps) runs on 2 instances under each
   type's emulated network (the ``shipyard:network`` tag), measured side by side with
   what the planner predicted for each on this machine (its measured ceiling between
   instances and its shared cores, ``shipyard doctor``), then the planner's table up to 64 instances
   (where shaping is unavailable it says so and plans from an unshaped run);
5. the model is deployed and answers JSON, JSON lines and CSV (an inference.py);
6. a batch transform scores a file of images;
7. where to look next: ``shipyard ui`` draws both reports side by side,
   ``shipyard tensorboard`` shows the first job's training curves.

The demo and the CLI share one home (``$SHIPYARD_HOME``, default ``~/.shipyard``), so
``shipyard jobs`` lists what the demo ran.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))

import numpy as np  # noqa: E402
from make_cifar_tfrecords import images, write  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import shipyard  # noqa: E402
from shipyard.debugger import TensorBoardOutputConfig  # noqa: E402
from shipyard.observe.report_view import render  # noqa: E402
from shipyard.sdk.deserializers import JSONDeserializer  # noqa: E402
from shipyard.sdk.serializers import CSVSerializer, JSONLinesSerializer  # noqa: E402

PS = {"parameter_server": {"enabled": True}}
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
METRICS = [
    {"Name": "eval:accuracy", "Regex": r"eval_accuracy=([0-9.]+)"},
    {"Name": "train:loss", "Regex": r" loss: ([0-9.]+)"},
]
out = Console(highlight=False)


_t0 = time.monotonic()


def step(n: int, text: str) -> None:
    out.rule(f"[bold]{n}. {text}[/]  [dim]{time.monotonic() - _t0:.0f} s[/]")


def report_of(estimator) -> dict | None:
    desc = estimator.latest_training_job.describe()
    return desc["Shipyard"].get("DistributionReport")


P2_TYPES = ("ml.p2.xlarge", "ml.p2.8xlarge")
COUNTS = [2, 4, 8, 16, 32, 64]


def measure_cnn(session, stamp: str, name: str, tags: list) -> dict:
    """The tutorials' CNN through shipyard.ps on 2 instances, 12 timed steps: its describe."""
    est = shipyard.PyTorch(
        entry_point="cifar10_cnn_timed.py",
        source_dir=os.path.join(HERE, "pytorch"),
        instance_count=2,
        instance_type="local",
        distribution=PS,
        hyperparameters={"steps": 12},
        metric_definitions=[{"Name": "step_time", "Regex": r"step_time=([0-9.e-]+)"}],
        tags=tags,
        session=session,
    )
    est.fit(job_name=f"demo-{name}-{stamp}", logs=False)
    return est.latest_training_job.describe()


def before_you_pay(session, stamp: str) -> None:
    """ml.p2.xlarge or ml.p2.8xlarge, and how many? Measured here under each type's
    network, side by side with the planner's prediction of the same run on this machine
    (``shipyard.planner.ceiling``: each emulated network capped at what two instances here
    move, this machine's cores shared by both, with the CPU shipyard.ps' push/pull costs
    them per byte; the measured run's compute as its workers measured it; no figure
    where the ceiling is unknown),
    then the planner's table for real instances up to 64, from the first measurement (what
    ``shipyard plan JOB`` prints)."""
    from shipyard import instance_types
    from shipyard.planner import ceiling, model, render
    from shipyard.planner.profile import Inputs, PlanInputError, from_describe
    from shipyard.sandbox import shaping

    load = os.getloadavg()[0]
    here_ceiling = ceiling.get(session.home)  # cached; measured first (about a second) if not
    machine = here_ceiling.machine()

    links = {
        t: model.Link(t, instance_types.network(t).bytes_per_s, framing=model.TCP_FRAMING)
        for t in P2_TYPES
    }
    support = shaping.support()
    measured: dict[str, dict] = {}
    if support.tbf:
        for t in P2_TYPES:
            rate = f"{instance_types.network(t).sustained_gbps:g}gbit"
            name = t.removeprefix("ml.").replace(".", "-")
            measured[t] = measure_cnn(session, stamp, name, [{"Key": shaping.TAG, "Value": rate}])
    else:
        out.print(
            f"network emulation is unavailable here ({support.detail}; `shipyard doctor` "
            "says what to install): both types would measure the same, so the CNN runs once "
            "unshaped and the planner answers from that"
        )
        measured["unshaped"] = measure_cnn(session, stamp, "unshaped", [])
    first = next(iter(measured.values()))
    try:
        here = from_describe(first, Inputs(machine=machine))
        real = from_describe(first)
    except PlanInputError as exc:
        out.print(f"no plan: {exc}")
        return
    table = Table("2 instances, network of", "measured steps/s", "planner, same machine")
    for t, desc in measured.items():
        got = from_describe(desc).step_s
        table.add_row(
            f"{t} ({instance_types.network(t).describe()})" if t in links else t,
            f"{2 / got:.2f}",
            "(the planner's input)"
            if desc is first or t not in links
            else render.same_machine_cell(here.profile, links[t], 2, machine),
        )
    out.print(table)
    out.print(
        f"same machine: {here_ceiling.line().removeprefix('same-machine ceiling: ')} "
        f"(`shipyard doctor`), each emulated network capped at it and the transport's CPU "
        f"charged on the shared cores; load average {load:.2f} "
        f"on {here_ceiling.cores:g} cores before these runs (other work on them slows the "
        "measured runs, not the figure)",
        markup=False,
    )
    two = model.predict(real.profile, links[P2_TYPES[0]], 2)
    out.print(
        f"for real instances, at 2 the network is {two.comm_s / two.step_s:.0%} of a step on "
        f"{P2_TYPES[0]}; what the types differ in shows at more instances. Compute per step "
        f"{real.profile.compute_s * 1e3:.0f} ms, measured on this machine's CPU (a p2's GPU "
        "is faster: give `shipyard plan --compute-time`); the planner, for real instances:"
    )
    rows = {
        (r.instance_type, r.instances): r
        for r in model.plan(real.profile, [*links.values()], COUNTS)
    }
    plan = Table("instances", *(f"{t} steps/s" for t in P2_TYPES), "bottleneck (ml.p2.xlarge)")
    for n in COUNTS:
        cells = [
            f"{rows[(t, n)].steps_per_s:8.1f}  {rows[(t, n)].efficiency:4.0%}" for t in P2_TYPES
        ]
        plan.add_row(str(n), *cells, rows[(P2_TYPES[0], n)].bottleneck)
    out.print(plan)
    slow, fast = rows[(P2_TYPES[0], 64)], rows[(P2_TYPES[1], 64)]
    out.print(
        f"at 64 instances ml.p2.8xlarge's network is x{fast.steps_per_s / slow.steps_per_s:.1f} "
        f"ml.p2.xlarge's; {slow.instance_type}: {slow.advice}",
        markup=False,
    )


def main() -> None:
    started = time.monotonic()
    session = shipyard.Session()  # $SHIPYARD_HOME or ~/.shipyard: the CLI's home too
    stamp = time.strftime("%H%M%S")
    data = tempfile.mkdtemp(prefix="shipyard-demo-")
    try:
        step(1, "CIFAR-10-shaped TFRecords (generated: 512 train, 128 eval)")
        inputs = {}
        for split, n, seed in (("train", 512, 1), ("eval", 128, 2)):
            os.makedirs(os.path.join(data, split))
            write(os.path.join(data, split, f"{split}.tfrecords"), n, seed)
            inputs[split] = os.path.join(data, split)
        out.print(f"written under {data}")

        step(
            2, "the tutorials' CNN as users wrote it (no strategy), parameter_server on 2 instances"
        )
        plain = shipyard.TensorFlow(
            entry_point="train.py",
            source_dir=os.path.join(HERE, "keras", "cifar10_cnn"),
            instance_count=2,
            instance_type="local",
            distribution=PS,
            hyperparameters={"epochs": 1},
            metric_definitions=METRICS,
            tensorboard_output_config=TensorBoardOutputConfig(
                s3_output_path="file://" + os.path.join(session.home, "tensorboard")
            ),
            session=session,
        )
        plain.fit(inputs, job_name=f"demo-no-strategy-{stamp}", logs=False)
        report = report_of(plain)
        if report:
            render(report, out)

        step(3, "the same CNN with ParameterServerStrategy on 2 instances")
        ps = shipyard.TensorFlow(
            entry_point="cifar10_ps.py",
            source_dir=os.path.join(HERE, "tensorflow"),
            instance_count=2,
            instance_type="local",
            distribution=PS,
            hyperparameters={"epochs": 3, "steps_per_epoch": 16},
            metric_definitions=METRICS,
            session=session,
        )
        ps.fit(inputs, job_name=f"demo-ps-strategy-{stamp}", logs=False)
        report = report_of(ps)
        if report:
            render(report, out)
        out.print(f"model: {ps.model_data}")

        step(4, "before you pay: ml.p2.xlarge or ml.p2.8xlarge, and how many instances?")
        before_you_pay(session, stamp)

        step(5, "deploy, then predict in JSON, JSON lines and CSV")
        model = shipyard.TensorFlowModel(
            model_data=ps.model_data,
            entry_point="inference.py",
            source_dir=os.path.join(HERE, "demo_serving"),
            sagemaker_session=session,
        )
        predictor = model.deploy(
            1, "local", endpoint_name=f"demo-cifar-{stamp}", deserializer=JSONDeserializer()
        )
        x, labels = images(4, seed=7)
        x = (x / 255.0).round(3)
        try:
            answers = {
                "JSON": predictor.predict(x.tolist()),
            }
            predictor.serializer = JSONLinesSerializer()
            answers["JSON lines"] = predictor.predict(x.tolist())
            predictor.serializer = CSVSerializer()
            answers["CSV"] = predictor.predict(x.reshape(len(x), -1))
            for kind, answer in answers.items():
                got = [p["class"] for p in answer["predictions"]]
                out.print(f"{kind:>10}: {got}")
            out.print(f"{'labels':>10}: {[CLASSES[i] for i in labels]}")
        finally:
            predictor.delete_endpoint()

        step(6, "batch transform: one image per line of a CSV file")
        batch_in = os.path.join(data, "batch")
        os.makedirs(batch_in)
        xb, _ = images(16, seed=9)
        np.savetxt(os.path.join(batch_in, "images.csv"), (xb / 255.0).reshape(16, -1), "%.3f", ",")
        transformer = model.transformer(
            instance_count=1,
            instance_type="local",
            output_path=os.path.join(session.home, "transform", f"demo-{stamp}"),
        )
        transformer.transform(batch_in, content_type="text/csv", split_type="Line", logs=False)
        result = os.path.join(transformer.output_path, "images.csv.out")
        with open(result, encoding="utf-8") as fh:
            text = fh.read()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        out.print(f"{result}: {len(lines)} answer line(s), e.g. {lines[0][:100]}")

        step(7, "where to look next")
        a, b = plain.latest_training_job.job_name, ps.latest_training_job.job_name
        out.print(
            f"  shipyard jobs                      both jobs, in {session.home}\n"
            f"  shipyard ui                        the dashboard; /jobs/{a},{b} draws both "
            "reports side by side\n"
            f"  shipyard tensorboard {a}   the first job's training curves\n"
            f"  shipyard metrics {b}       metric history with a small plot\n"
            f"  shipyard describe {b}      placement and traffic in the terminal"
        )
        out.print(f"demo finished in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
