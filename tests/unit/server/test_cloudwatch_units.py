"""server.monitoring's pure parts: period buckets and statistics, and the Smithy RPC v2
CBOR wire format checked against botocore's own client-side serializer and parser."""

from __future__ import annotations

import datetime as dt

import pytest

from shipyard.server.errors import ApiError
from shipyard.server.monitoring import MonitoringApi, buckets, decode, encode, statistic

UTC = dt.timezone.utc


def test_buckets_group_by_period_within_the_window():
    points = [(100.0, 1.0), (159.0, 3.0), (160.0, 10.0), (400.0, 99.0), (99.0, 5.0)]
    assert buckets(points, 100.0, 300.0, 60) == [(100.0, [1.0, 3.0]), (160.0, [10.0])]
    assert [statistic(s, [1.0, 3.0]) for s in ("Average", "Sum", "Minimum", "Maximum")] == [
        2.0,
        4.0,
        1.0,
        3.0,
    ]
    assert statistic("SampleCount", [1.0, 3.0]) == 2.0


def _api() -> MonitoringApi:
    series = {
        ("Host", "job/algo-1"): [("CPUUtilization", 1000.0, 50.0), ("CPUUtilization", 1010.0, 70.0)]
    }
    return MonitoringApi(lambda d, v: series.get((d, v), []), lambda: [("Host", "job/algo-1")])


def test_cbor_request_and_answer_round_trip_through_botocore():
    import botocore.session
    from botocore.parsers import RpcV2CBORParser
    from botocore.serialize import RpcV2CBORSerializer

    model = botocore.session.get_session().get_service_model("cloudwatch")
    op = model.operation_model("GetMetricStatistics")
    request = RpcV2CBORSerializer().serialize_to_request(
        {
            "Namespace": "/aws/sagemaker/TrainingJobs",
            "MetricName": "CPUUtilization",
            "Dimensions": [{"Name": "Host", "Value": "job/algo-1"}],
            "StartTime": dt.datetime.fromtimestamp(960, UTC),
            "EndTime": dt.datetime.fromtimestamp(1080, UTC),
            "Period": 60,
            "Statistics": ["Average", "Maximum"],
        },
        op,
    )
    body = decode(request["body"])
    assert body["StartTime"].timestamp() == 960
    result = _api().get_metric_statistics(body)
    parsed = RpcV2CBORParser().parse(
        {"body": encode("GetMetricStatistics", result), "headers": {}, "status_code": 200},
        op.output_shape,
    )
    assert parsed["Datapoints"] == [
        {
            "Timestamp": dt.datetime.fromtimestamp(960, UTC),
            "Average": 60.0,
            "Maximum": 70.0,
            "Unit": "None",
        }
    ]


def test_bad_requests_say_what_was_wrong():
    api = _api()
    base = {"Namespace": "/aws/sagemaker/TrainingJobs", "MetricName": "CPUUtilization"}
    window = {"StartTime": 0.0, "EndTime": 100.0, "Period": 60}
    with pytest.raises(ApiError, match="dimension Host"):
        api.get_metric_statistics(dict(base, **window, Statistics=["Average"]))
    with pytest.raises(ApiError, match="Statistics must name"):
        api.get_metric_statistics(
            dict(base, **window, Statistics=["p99"], Dimensions=[{"Name": "Host", "Value": "x"}])
        )
    with pytest.raises(ApiError, match="only MetricStat"):
        api.get_metric_data({**window, "MetricDataQueries": [{"Id": "e", "Expression": "1"}]})
    with pytest.raises(ApiError, match="not valid CBOR"):
        decode(b"\xff\x00")
