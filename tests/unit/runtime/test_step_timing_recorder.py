"""One step recorder per process, shared by the libraries that see a step (issue 39): the
first to time a step owns the steps, the others add communication; DDP's bucket spans
give the wait, the overlap and the bytes of a step; the summary carries them."""

from __future__ import annotations

import json

from shipyard.ddp import steptiming as ddp_steps
from shipyard.planner import steps
from shipyard.runtime import steptiming


def test_the_first_library_to_time_a_step_owns_them_and_others_add_communication(tmp_path):
    path = str(tmp_path / "step-timing-1.json")
    keras = steptiming.shared(path, "keras fit")
    hvd = steptiming.shared(path, "horovod allreduce")
    assert keras is hvd  # one recorder, one file
    for _ in range(3):
        assert keras.claim("keras fit")
        keras.begin()
        hvd.comm(0.002, nbytes=1000, source="horovod allreduce")
        if hvd.claim("horovod allreduce"):  # not the owner: it does not end the step
            hvd.mark()
        keras.end()
    keras.flush()
    doc = json.loads(open(path).read())
    assert doc["count"] == 3 and doc["source"] == "keras fit + horovod allreduce"
    assert all(s[1] == 0.002 and s[2] is None and s[3] == 1000 for s in doc["steps"])


def test_communication_between_steps_is_not_counted_in_the_next(tmp_path):
    rec = steptiming.StepRecorder(str(tmp_path / "f.json"), "tf session")
    rec.comm(5.0)  # a broadcast before training
    rec.begin()
    rec.end()
    assert rec.document()["steps"][0][1] is None


def test_ddp_buckets_give_the_wait_the_overlap_and_the_bytes():
    buckets = ddp_steps._Buckets()
    assert buckets.take() is None
    first, last = buckets.started(400), buckets.started(600)
    # bucket 1 ready at 0.0, done 0.3; bucket 2 (backward over) ready 0.2, done 0.5
    first[0], first[1], last[0], last[1] = 0.0, 0.3, 0.2, 0.5
    waited, overlap, nbytes = buckets.take()
    assert round(waited, 6) == 0.3  # from the last bucket's readiness to the last completion
    assert round(overlap, 6) == 0.2  # 0.5 s of exchange in all, 0.3 s of it waited for
    assert nbytes == 1000 and buckets.take() is None
    assert ddp_steps._span_length([(0, 1), (0.5, 2), (3, 4)]) == 3


def test_overlap_and_bytes_reach_the_summary_and_the_line(tmp_path):
    rec = steptiming.StepRecorder(str(tmp_path / "step-timing-7.json"), "torch DDP")
    rec.mark()
    for _ in range(10):
        rec.comm(0.01, overlap=0.02, nbytes=76840)
        rec.mark()
    rec.flush()
    doc = dict(json.loads(open(rec.path).read()), host="algo-1")
    assert steps._valid(doc)
    timing = steps.summarize([doc])
    assert timing["OverlapSeconds"] == 0.02 and timing["BytesPerStep"] == 76840
    assert timing["CommSeconds"] == 0.01
    line = steps.describe_line(timing)
    assert "(0.02s more hidden behind compute); 76,840 bytes exchanged per step" in line
    # a file of two-number steps (before) still reads, without them
    old = dict(doc, steps=[s[:2] for s in doc["steps"]])
    assert steps._valid(old) and steps.summarize([old])["BytesPerStep"] is None
