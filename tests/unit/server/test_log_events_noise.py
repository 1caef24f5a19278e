"""Issue 28: the SDK's ``estimator.logs()`` (CloudWatch GetLogEvents through shipyard server)
showed every I0000 line and absl warning that ``shipyard logs`` hides. GetLogEvents now
applies the same filter; the tokens the SDK resumes by still count every line."""

from __future__ import annotations

from shipyard.server.logs import LogsApi

GROUP = "/aws/sagemaker/TrainingJobs"
STREAM = "job/algo-1-1700000000"
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795814471.442137   29010 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
    "[algo-2 rank 3] I0000 00:00:1795814471.616511   29010 cpu_feature_guard.cc:227] This TensorFlow binary is optimized",
    "[algo-1 rank 0] E0000 00:00:1795814487.226964   29010 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
]
USER = ["epoch 1 loss=0.5", "[algo-2 rank 3] step 7", "I think I0000 is a fine name"]


def _api(tmp_path):
    log = tmp_path / "algo-1.log"
    lines = [NOISE[0], USER[0], NOISE[1], NOISE[2], USER[1], NOISE[3], USER[2]]
    log.write_text("\n".join(lines) + "\n")
    return LogsApi(lambda group, prefix: {STREAM: str(log)} if group == GROUP else {})


def _get(api, token=None):
    body = {"logGroupName": GROUP, "logStreamName": STREAM, "startFromHead": True}
    if token:
        body["nextToken"] = token
    return api.get_log_events(body)


def test_framework_noise_is_hidden_as_shipyard_logs_hides_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SHIPYARD_LOG_NOISE", raising=False)
    api = _api(tmp_path)
    got = _get(api)
    assert [e["message"] for e in got["events"]] == USER
    assert got["nextForwardToken"] == "f/7"  # every line counted: the SDK resumes after them
    assert _get(api, got["nextForwardToken"])["events"] == []


def test_shipyard_log_noise_show_shows_it_all(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_LOG_NOISE", "show")
    assert len(_get(_api(tmp_path))["events"]) == len(NOISE) + len(USER)
