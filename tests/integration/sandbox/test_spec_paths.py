"""Paths a spec names never bring back what an instance hides (issue 37).

An SDK job names its own ``SHIPYARD_HOME`` as ``checkpoint_local_path`` and another
shipyard home (under ``/tmp``, as a second user's server would keep it) in a
hyperparameter and in its environment. Neither is bound into the instance: the job cannot
list its own home (its tree inside is reached, not listed) and does not find the other at
all; a plain directory it is handed is still the host's, and so is a local channel.
"""

from __future__ import annotations

import json
import tarfile

import pytest

import shipyard
from shipyard.sandbox import probe

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

SCRIPT = r"""
import json, os, sys
out = {}
def look(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return type(exc).__name__
args = sys.argv[1:]
for name in ("home", "other", "plain"):
    out[name] = look(args[args.index("--" + name) + 1])
out["other_env"] = look(os.environ["OTHER_HOME"])
out["channel"] = look(os.environ["SM_CHANNEL_TRAINING"])
with open(os.path.join(args[args.index("--plain") + 1], "from-job"), "w") as fh:
    fh.write("probe")
with open(os.path.join(os.environ["SM_MODEL_DIR"], "paths.json"), "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.timeout(180)
def test_a_spec_naming_shipyard_homes_unmasks_neither(session, write_script, home, tmp_path):
    other = tmp_path / "other-home"
    (other / "jobs" / "someone-elses-job").mkdir(parents=True)
    (other / "jobs" / "someone-elses-job" / "agent.json").write_text("{}")
    plain = tmp_path / "plain"
    plain.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.csv").write_text("1\n")
    est = shipyard.PyTorch(
        entry_point="paths.py",
        source_dir=write_script("paths.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        checkpoint_local_path=str(home),
        hyperparameters={"home": str(home), "other": str(other), "plain": str(plain)},
        environment={"OTHER_HOME": str(other)},
        session=session,
    )
    est.fit({"training": f"file://{data}"}, job_name="spec-paths", logs=False)
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        member = tar.extractfile("paths.json")
        assert member is not None
        seen = json.load(member)
    assert seen["home"] == "PermissionError", seen  # passed through to its tree, not listed
    assert seen["other"] == seen["other_env"] == "FileNotFoundError", seen
    assert seen["plain"] == [] and (plain / "from-job").read_text() == "probe", seen
    assert seen["channel"] == ["rows.csv"], seen
    missing = est.latest_training_job.describe()["Shipyard"]["MissingProtections"]
    assert not [m for m in missing if "can be listed" in m], missing
