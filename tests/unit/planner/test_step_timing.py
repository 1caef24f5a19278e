"""Step times shipyard measures itself (issue 39): the workers' files, their summary in
describe's ``Shipyard.StepTiming`` (warm-up kept apart), and the planner's choice of step
time (a given or declared one wins and is said; a Failed job is planned from the steps
it ran, or refused in one line)."""

from __future__ import annotations

import json
import os

import pytest

from shipyard.planner import steps
from shipyard.planner.profile import Inputs, PlanInputError, from_describe
from shipyard.runtime.steptiming import PREFIX, StepRecorder, path_beside
from tests.unit.planner.test_inputs import _desc


def _worker(agent_dir, pid, seconds, comm=None, source="shipyard.ps client"):
    """A worker's file as a StepRecorder writes it, with these step times."""
    os.makedirs(agent_dir, exist_ok=True)
    rec = StepRecorder(os.path.join(agent_dir, f"{PREFIX}{pid}.json"), source)
    for i, s in enumerate(seconds):
        rec._comm = None if comm is None else comm[i]
        rec._add(s)
    rec.flush()
    return rec


def test_warm_up_is_ten_percent_at_least_two_leaving_one():
    assert [steps.warmup_steps(n) for n in (0, 1, 2, 3, 10, 20, 69, 1000)] == [
        0,
        0,
        1,
        2,
        2,
        2,
        7,
        100,
    ]


def test_recorder_marks_begin_end_and_comm(tmp_path):
    path = path_beside(str(tmp_path / "distribution-report.json"))
    assert path == str(tmp_path / f"{PREFIX}{os.getpid()}.json")
    assert path_beside(None) is None and path_beside("") is None
    rec = StepRecorder(path, "test")
    rec.mark()  # the first mark only starts the clock: what came before is start-up
    rec.comm(0.001)
    rec.mark()
    rec.begin()
    rec.end()
    rec.end()  # an end without a begin adds nothing
    rec.flush()
    doc = json.loads(open(path).read())
    assert doc["schema"] == "shipyard.steps/v1" and doc["count"] == 2
    assert doc["steps"][0][1] == 0.001 and doc["steps"][1][1] is None
    assert doc["first_step_at"] >= doc["started"]


def test_summary_excludes_warm_up_and_splits_compute_from_comm(tmp_path):
    job = tmp_path
    a1, a2 = str(job / "instances/algo-1/agent"), str(job / "instances/algo-2/agent")
    # 20 steps each: the first 2 are slow (warm-up), then 0.1 s of which 0.04 s push/pull
    slow = [2.0, 1.0] + [0.1] * 18
    _worker(a1, 11, slow, [0.5, 0.5] + [0.04] * 18)
    _worker(a2, 12, [3.0, 1.0] + [0.12] * 18, [0.5, 0.5] + [0.04] * 18)
    with open(os.path.join(a2, f"{PREFIX}13.json"), "w") as fh:
        fh.write("{not json")  # a broken file is skipped
    for pid, bad in enumerate(
        (
            {"steps": [["x", None]]},
            {"steps": [[0.1]]},
            {"steps": [[0.1, None]], "count": "many"},
            {"steps": [[0.1, None]], "source": 3},
            {"steps": [[-1, None]]},
        )
    ):  # what a script could leave in its own tree: skipped, describe does not fail
        with open(os.path.join(a2, f"{PREFIX}9{pid}.json"), "w") as fh:
            json.dump({"schema": "shipyard.steps/v1", "source": "x", **bad}, fh)
    os.symlink("/etc/passwd", os.path.join(a1, f"{PREFIX}14.json"))  # a link is not followed
    docs = steps.read(str(job), {"algo-1": a1, "algo-2": a2, "algo-3": str(job / "none")})
    assert sorted(d["host"] for d in docs) == ["algo-1", "algo-2"]
    t = steps.summarize(docs)
    assert (t["Workers"], t["StepsRun"], t["Steps"], t["WarmupStepsExcluded"]) == (2, 40, 36, 4)
    assert t["WarmupSeconds"] == pytest.approx(7.0)
    assert t["MedianStepSeconds"] == pytest.approx(0.11)  # between the two workers' 0.1, 0.12
    assert t["P90StepSeconds"] == pytest.approx(0.12)
    assert t["CommSeconds"] == pytest.approx(0.04)
    assert t["ComputeSeconds"] == pytest.approx(0.07)
    assert [w["MedianStepSeconds"] for w in t["PerWorker"]] == [0.1, 0.12]
    line = steps.describe_line(t)
    assert "0.11s per step" in line and "36 steps of 2 worker(s)" in line
    assert "shipyard.ps client" in line and "compute 0.07s + communication 0.04s" in line
    assert steps.summarize([]) == {}


def test_a_coordinator_s_epochs_are_grouped_and_its_first_is_warm_up(tmp_path):
    a1 = str(tmp_path / "instances/algo-1/agent")
    rec = _worker(a1, 31, [], source="keras fit")
    rec.add_group(4.0, 8, warmup=True)  # the first epoch: tracing, connections
    rec.add_group(0.4, 8)
    rec.add_group(0.5, 0)  # an empty epoch adds nothing
    rec.flush()
    t = steps.summarize(steps.read(str(tmp_path), {"algo-1": a1}))
    assert (t["StepsRun"], t["WarmupStepsExcluded"], t["Steps"]) == (16, 8, 8)
    assert t["MedianStepSeconds"] == pytest.approx(0.05) and t["WarmupSeconds"] == 4.0
    one = str(tmp_path / "instances/algo-2/agent")
    only = _worker(one, 32, [], source="keras fit")
    only.add_group(1.0, 10, warmup=True)  # one epoch only: the usual first 10% go
    only.flush()
    assert steps.summarize(steps.read(str(tmp_path), {"algo-2": one}))["Steps"] == 8


def test_keras_steps_have_no_communication_split(tmp_path):
    a1 = str(tmp_path / "instances/algo-1/agent")
    _worker(a1, 21, [5.0, 0.3, 0.2, 0.2, 0.2, 0.2], source="keras fit")
    t = steps.summarize(steps.read(str(tmp_path), {"algo-1": a1}))
    assert t["Source"] == "keras fit" and t["MedianStepSeconds"] == pytest.approx(0.2)
    assert t["CommSeconds"] is None and "communication" not in steps.describe_line(t)


def _timing(median=0.065, timed=60, run=69):
    return {
        "Source": "shipyard.ps client",
        "Workers": 2,
        "StepsRun": run * 2,
        "WarmupStepsExcluded": 14,
        "WarmupSeconds": 3.0,
        "Steps": timed,
        "MedianStepSeconds": median,
        "P90StepSeconds": median * 1.2,
        "ComputeSeconds": None,
        "CommSeconds": None,
        "PerWorker": [],
    }


def _timed_desc(**over):
    desc = _desc(**over)
    desc["Shipyard"]["MetricHistory"] = []
    desc["Shipyard"]["StepTiming"] = _timing()
    return desc


def test_measured_steps_come_before_the_wall_time():
    m = from_describe(_timed_desc())
    assert m.step_s == pytest.approx(0.065)  # not TrainingTimeInSeconds / 10 = 3 s
    assert m.sources["step_time"].startswith(
        "measured by shipyard (shipyard.ps client): 0.065s per step (median; p90 0.078s) "
        "over 60 steps of 2 worker(s); 14 warm-up step(s) excluded"
    )
    assert "job_status" not in m.sources


def test_a_declared_or_given_step_time_wins_and_is_said():
    desc = _desc()
    desc["Shipyard"]["StepTiming"] = _timing()
    m = from_describe(desc)
    assert m.step_s == pytest.approx(0.4)
    assert m.sources["step_time"] == (
        "the job's step-time metric (wins over shipyard's measured 0.065s)"
    )
    g = from_describe(desc, Inputs(step_s=0.5))
    assert g.step_s == 0.5
    assert g.sources["step_time"] == "given (--step-time) (wins over shipyard's measured 0.065s)"


@pytest.mark.parametrize("status", ["Failed", "Stopped"])
def test_an_ended_job_that_ran_enough_steps_is_planned_from_them(status):
    m = from_describe(_timed_desc(TrainingJobStatus=status))
    assert m.step_s == pytest.approx(0.065)
    assert (
        m.sources["job_status"]
        == f"{status}: planned from the steps it ran (60 timed after warm-up)"
    )


def test_an_ended_job_with_too_few_steps_is_refused_in_one_line():
    few = _timed_desc(TrainingJobStatus="Failed")
    few["Shipyard"]["StepTiming"] = _timing(timed=3, run=4)
    with pytest.raises(PlanInputError) as err:
        from_describe(few)
    msg = str(err.value)
    assert "\n" not in msg and "logs -f" not in msg
    assert "is Failed and cannot be planned: only 3 step(s) were timed after warm-up" in msg
    none = _desc(TrainingJobStatus="Stopped")
    none["Shipyard"]["MetricHistory"] = []
    with pytest.raises(
        PlanInputError, match="is Stopped and cannot be planned: shipyard timed none"
    ):
        from_describe(none)
    # what the user gives still plans it
    assert from_describe(few, Inputs(step_s=0.2)).step_s == 0.2


def test_a_running_job_is_asked_to_finish_first():
    with pytest.raises(PlanInputError, match="is InProgress: plan needs a job that has ended"):
        from_describe(_timed_desc(TrainingJobStatus="InProgress"))


def test_the_dashboard_plan_card_plans_a_failed_job_or_says_why_in_one_line():
    from shipyard.dashboard import plan as card

    ok = card.predict(_timed_desc(TrainingJobStatus="Failed"), card.Query(instances="1,2"))
    assert ok["plannable"] and ok["measured"]["step_s"] == pytest.approx(0.065)
    assert ok["measured"]["sources"]["job_status"].startswith("Failed: planned from the steps")
    failed = _desc(TrainingJobStatus="Failed")
    failed["Shipyard"]["MetricHistory"] = []
    with pytest.raises(PlanInputError) as err:
        card.predict(failed, card.Query())
    assert "\n" not in str(err.value) and "logs -f" not in str(err.value)


def test_a_coordinator_s_steps_are_shared_by_the_workers():
    desc = _timed_desc(AlgorithmSpecification={"TrainingImage": "tensorflow"})
    del desc["Shipyard"]["DistributionReport"]["shards"]  # TF reports no push counts
    desc["Shipyard"]["StepTiming"].update(Workers=1, StepsRun=20, Source="keras fit")
    m = from_describe(desc)
    assert m.profile.distribution == "tf_parameter_server"
    # 20 coordinator steps over 2 workers: 10 each, so 24200 B / 10 / 2 / 1100 B = 1.1
    assert m.profile.push_overhead == pytest.approx(1.1)
