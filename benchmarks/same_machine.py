"""How well the planner's "same machine" figure matches ``make demo``'s "before you pay" runs (issue 39).

    .venv/bin/python benchmarks/same_machine.py [--runs 3] [--keep-ceiling] [--save FILE]
    .venv/bin/python benchmarks/same_machine.py --replay FILE


The demo's runs, as the demo makes them (``examples/demo.py``'s ``measure_cnn``: the
tutorials' CNN through shipyard.ps on 2 instances, each instance's link shaped with the
``shipyard:network`` tag) at ml.p2.xlarge's 1.25 Gbit/s and ml.p2.8xlarge's 10 Gbit/s.
This machine's ceiling (``shipyard.planner.ceiling``: the link between two instances and
shipyard.ps' CPU per byte) is measured first (``--keep-ceiling``: the cached one), then
each run of one network is predicted from the run of the other network in the same round
(``model.same_machine``, the profile read with ``Inputs(machine=...)``, as the demo reads
it), and compared with what it measured (worker steps per second: 2 / the mean of the
hosts' timed step).

Prints one line per prediction with the 1-minute load average before the round (other
work on this machine's cores slows the measured runs, not the figure), the measured run's
own split (the ps client's compute and push/pull medians), the predicted compute,
communication, step and bottleneck, what the model said before issue 39's transport term
(shared cores only, compute derived from the link), and ends with
``RESULT same_machine err_p2_xlarge=.. err_p2_8xlarge=.. ceiling_gbit=.. ps_cpu_s_per_gb=.. load=.. runs=..``:
each error the median over the rounds of |predicted - measured| / measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "examples" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result  # noqa: E402

NETWORKS = {"ml.p2.xlarge": "1.25gbit", "ml.p2.8xlarge": "10gbit"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds of both networks")
    parser.add_argument("--keep-ceiling", action="store_true", help="use the cached ceiling")
    parser.add_argument("--save", help="write the rounds' describes and the ceiling here (JSON)")
    parser.add_argument(
        "--replay", help="predict the rounds a --save wrote again, with this tree's model"
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.replay:
        replay(Path(args.replay))
        return
    import demo

    import shipyard
    from shipyard import instance_types
    from shipyard.planner import ceiling, model
    from shipyard.planner.profile import Inputs, from_describe
    from shipyard.sandbox import probe, shaping

    if not probe.support().ok or not shaping.support().tbf:
        sys.exit("no instance sandbox or no tc's tbf here: the demo's shaped runs cannot run")
    home = os.environ.get("SHIPYARD_HOME") or tempfile.mkdtemp(prefix="shipyard-bench-")
    session = shipyard.Session(home=home)
    found = ceiling.get(home, refresh=not args.keep_ceiling)
    print(found.line(), f"(load average {found.load_average:.2f} when measured)", flush=True)
    machine = found.machine()
    links = {
        t: model.Link(t, instance_types.network(t).bytes_per_s, framing=model.TCP_FRAMING)
        for t in NETWORKS
    }
    errors: dict[str, list[float]] = {t: [] for t in NETWORKS}
    loads = []
    saved: list[dict] = []
    for r in range(args.runs):
        load = os.getloadavg()[0]
        loads.append(load)
        stamp = f"{time.strftime('%H%M%S')}r{r}"
        descs = {
            t: demo.measure_cnn(
                session,
                stamp,
                t.removeprefix("ml.").replace(".", "-"),
                [{"Key": shaping.TAG, "Value": rate}],
            )
            for t, rate in NETWORKS.items()
        }
        saved.append({"load": load, "describes": descs})
        if args.save:
            Path(args.save).write_text(
                json.dumps({"ceiling": found.to_json(), "rounds": saved}, default=str)
            )
        for target, other in (("ml.p2.8xlarge", "ml.p2.xlarge"), ("ml.p2.xlarge", "ml.p2.8xlarge")):
            measured = 2 / from_describe(descs[target]).step_s
            split = descs[target]["Shipyard"].get("StepTiming") or {}
            ref = from_describe(descs[other], Inputs(machine=machine))
            row = model.same_machine(ref.profile, links[target], 2, machine)
            predicted = row.steps_per_s
            old = _before(descs[other], links[target], machine)
            err = abs(predicted - measured) / measured
            errors[target].append(err)
            print(
                f"round {r} load {load:.2f}: {target} measured {measured:.2f} steps/s "
                f"(step {_ms(split.get('MedianStepSeconds'))}: compute "
                f"{_ms(split.get('ComputeSeconds'))} + push/pull {_ms(split.get('CommSeconds'))}, "
                f"overlap {_ms(split.get('OverlapSeconds'))}), predicted from {other} {predicted:.2f} ({err:.1%}: compute "
                f"{_ms(row.compute_s)}, link {_ms(row.comm_s)}, step {_ms(row.step_s)}, "
                f"{row.bottleneck}); before (HEAD's model) {old:.2f} "
                f"({abs(old - measured) / measured:.1%})",
                flush=True,
            )
    result(
        "same_machine",
        err_p2_xlarge=statistics.median(errors["ml.p2.xlarge"]),
        err_p2_8xlarge=statistics.median(errors["ml.p2.8xlarge"]),
        ceiling_gbit=found.gbit_per_s or 0.0,
        ps_cpu_s_per_gb=found.ps_cpu_s_per_gb or 0.0,
        load=statistics.median(loads),
        runs=args.runs,
    )


def replay(path: Path) -> None:
    """The rounds a ``--save`` wrote, predicted again with this tree's model (the same
    runs, so a model change is compared without the machine's noise between runs)."""
    from shipyard import instance_types
    from shipyard.planner import ceiling, model
    from shipyard.planner.profile import Inputs, from_describe

    data = json.loads(path.read_text())
    found = ceiling.Ceiling.from_json(data["ceiling"])
    machine = found.machine()
    print(found.line(), f"(load average {found.load_average:.2f} when measured)")
    errors: dict[str, list[float]] = {t: [] for t in NETWORKS}
    for r, rnd in enumerate(data["rounds"]):
        descs = rnd["describes"]
        for target, other in (("ml.p2.8xlarge", "ml.p2.xlarge"), ("ml.p2.xlarge", "ml.p2.8xlarge")):
            link = model.Link(
                target, instance_types.network(target).bytes_per_s, framing=model.TCP_FRAMING
            )
            measured = 2 / from_describe(descs[target]).step_s
            split = descs[target]["Shipyard"].get("StepTiming") or {}
            ref = from_describe(descs[other], Inputs(machine=machine))
            row = model.same_machine(ref.profile, link, 2, machine)
            err = abs(row.steps_per_s - measured) / measured
            errors[target].append(err)
            print(
                f"round {r} load {rnd['load']:.2f}: {target} measured {measured:.2f} "
                f"(step {_ms(split.get('MedianStepSeconds'))}: compute "
                f"{_ms(split.get('ComputeSeconds'))} + push/pull {_ms(split.get('CommSeconds'))}"
                f", overlap {_ms(split.get('OverlapSeconds'))}), predicted {row.steps_per_s:.2f} "
                f"({err:.1%}: compute {_ms(row.compute_s)}, link {_ms(row.comm_s)}, step "
                f"{_ms(row.step_s)}, {row.bottleneck})"
            )
    print(
        f"replay err_p2_xlarge={statistics.median(errors['ml.p2.xlarge']):.4f} "
        f"err_p2_8xlarge={statistics.median(errors['ml.p2.8xlarge']):.4f}"
    )


def _before(desc: dict, link, machine) -> float:  # noqa: ANN001 - planner types, imported late
    """What the model said before issue 39's transport term, on the same run: the link
    capped at the ceiling and the cores shared, the transport free, the compute derived
    from the step less the link's time (the job's step timing not read)."""
    from dataclasses import replace

    from shipyard.planner import model
    from shipyard.planner.profile import Inputs, from_describe

    bare = dict(desc, Shipyard={k: v for k, v in desc["Shipyard"].items() if k != "StepTiming"})
    free = replace(machine, ps_cpu_s_per_byte=0.0)
    ref = from_describe(bare, Inputs(machine=free))
    return model.same_machine(ref.profile, link, 2, free).steps_per_s


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.1f} ms"


if __name__ == "__main__":
    main()
