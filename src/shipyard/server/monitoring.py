"""CloudWatch metrics, read-only: where the SageMaker SDK and boto3 look for a training
job's metrics (namespace ``/aws/sagemaker/TrainingJobs``).

* dimension ``Host`` = ``<job>/algo-k``: the instance's utilization (``CPUUtilization``,
  ``MemoryUtilization``, ``DiskUtilization``, ``GPUUtilization``, ... as
  ``observe.utilization`` samples them), as SageMaker publishes instance metrics;
* dimension ``TrainingJobName`` = ``<job>``: the job's ``metric_definitions`` matches
  (what ``TrainingJobAnalytics`` asks for).

``GetMetricStatistics``, ``GetMetricData`` (``MetricStat`` queries) and ``ListMetrics``,
in both protocols botocore may pick for CloudWatch: JSON 1.0 (``X-Amz-Target:
GraniteServiceVersion20100801.<Operation>``; what boto3 uses here) and Smithy RPC v2
CBOR (``POST /service/GraniteServiceVersion20100801/operation/<Operation>``). CBOR
requests are decoded by botocore's own CBOR reader and answers encoded by its serializer
against the operation's output shape from botocore's service model, so nothing here
hand-writes that wire format beyond an error's two strings.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, json_response

NAMESPACE = "/aws/sagemaker/TrainingJobs"
PATH_PREFIX = "/service/GraniteServiceVersion20100801/operation/"
TARGET_PREFIX = "GraniteServiceVersion20100801."
STATISTICS = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")
MAX_DATAPOINTS = 1440  # CloudWatch's own limit per GetMetricStatistics call

# series(job, dimension, value) -> [(metric name, epoch seconds, value)]
Series = Callable[[str, str], list[tuple[str, float, float]]]


@lru_cache(maxsize=1)
def _model():
    import botocore.session

    return botocore.session.get_session().get_service_model("cloudwatch")


def decode(body: bytes) -> dict[str, Any]:
    """A request body (CBOR) as a dict; timestamps become aware datetimes."""
    from botocore.parsers import RpcV2CBORParser

    if not body:
        return {}
    parser = RpcV2CBORParser()
    try:
        value = parser.parse_data_item(parser.get_peekable_stream_from_bytes(body))
    except Exception as exc:  # noqa: BLE001 - any malformed body is the client's error
        raise ApiError("SerializationException", f"the body is not valid CBOR: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError("SerializationException", "the body must be a CBOR map")
    return value


def encode(operation: str, result: dict[str, Any]) -> bytes:
    """``result`` in CBOR, typed by the operation's output shape."""
    from botocore.serialize import RpcV2CBORSerializer

    shape = _model().operation_model(operation).output_shape
    body = bytearray()
    RpcV2CBORSerializer()._serialize_data_item(body, result, shape)
    return bytes(body)


def _cbor_text(value: str) -> bytes:
    data = value.encode()
    n = len(data)
    if n < 24:
        head = bytes([0x60 | n])
    elif n < 256:
        head = bytes([0x78, n])
    elif n < 65536:
        head = bytes([0x79]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x7A]) + n.to_bytes(4, "big")
    return head + data


def error_response(err: ApiError) -> Response:
    """An RPC v2 CBOR error: a map of ``__type`` and ``message``."""
    body = bytes([0xA2]) + _cbor_text("__type") + _cbor_text(err.code)
    body += _cbor_text("message") + _cbor_text(err.message)
    return Response(
        err.status,
        body,
        {
            "Content-Type": "application/cbor",
            "smithy-protocol": "rpc-v2-cbor",
            "x-amzn-query-error": f"{err.code};{'Sender' if err.status < 500 else 'Receiver'}",
        },
    )


def _epoch(value: Any, name: str) -> float:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    raise ApiError("InvalidParameterValue", f"{name} must be a timestamp")


def _dimension(dimensions: list[dict[str, Any]] | None) -> tuple[str, str]:
    """The one dimension shipyard keys metrics by: ``Host`` or ``TrainingJobName``."""
    dims = {d.get("Name"): d.get("Value") for d in dimensions or []}
    for name in ("Host", "TrainingJobName"):
        value = dims.get(name)
        if isinstance(value, str) and value:
            return name, value
    raise ApiError(
        "InvalidParameterCombination",
        "a training job's metrics are found by the dimension Host (<job>/algo-k, instance "
        "utilization) or TrainingJobName (<job>, its metric_definitions); got "
        + (", ".join(map(str, dims)) or "no dimension"),
    )


def buckets(
    points: list[tuple[float, float]], start: float, end: float, period: int
) -> list[tuple[float, list[float]]]:
    """Values grouped by period (each bucket's start, its values), in time order."""
    grouped: dict[float, list[float]] = {}
    for at, value in points:
        if start <= at < end:
            key = start + math.floor((at - start) / period) * period
            grouped.setdefault(key, []).append(value)
    return sorted(grouped.items())


def statistic(name: str, values: list[float]) -> float:
    if name == "SampleCount":
        return float(len(values))
    if name == "Sum":
        return float(sum(values))
    if name == "Minimum":
        return float(min(values))
    if name == "Maximum":
        return float(max(values))
    return float(sum(values) / len(values))  # Average


class MonitoringApi:
    """``series(dimension, value)``: the (metric, time, value) points of that dimension."""

    def __init__(self, series: Series, dimensions: Callable[[], list[tuple[str, str]]]) -> None:
        self._series = series
        self._dimensions = dimensions

    def handle(self, req: Request) -> Response:
        path = req.raw_path.split("?", 1)[0]
        target = req.headers.get("x-amz-target", "")
        cbor = path.startswith(PATH_PREFIX)
        if target.startswith(TARGET_PREFIX):
            operation = target[len(TARGET_PREFIX) :]
        elif cbor and req.method == "POST":
            operation = path[len(PATH_PREFIX) :]
        else:
            raise ApiError(
                "UnknownOperationException",
                f"CloudWatch is served as JSON 1.0 (X-Amz-Target: {TARGET_PREFIX}<Operation>) "
                f"or Smithy RPC v2 CBOR (POST {PATH_PREFIX}<Operation>)",
            )
        handlers = {
            "GetMetricStatistics": self.get_metric_statistics,
            "GetMetricData": self.get_metric_data,
            "ListMetrics": self.list_metrics,
        }
        if operation not in handlers:
            raise ApiError(
                "UnknownOperationException",
                f"CloudWatch operation {operation!r} is not served ("
                + ", ".join(handlers)
                + " are)",
            )
        if not cbor:
            result = handlers[operation](req.json())
            return json_response(result, content_type="application/x-amz-json-1.0")
        result = handlers[operation](decode(req.body))
        return Response(
            200,
            encode(operation, result),
            {"Content-Type": "application/cbor", "smithy-protocol": "rpc-v2-cbor"},
        )

    def _points(self, namespace: Any, metric: Any, dimensions: Any) -> list[tuple[float, float]]:
        if namespace != NAMESPACE:
            return []  # SageMaker publishes nothing else here
        dimension, value = _dimension(dimensions)
        return [(at, v) for name, at, v in self._series(dimension, value) if name == metric]

    @staticmethod
    def _window(body: dict[str, Any]) -> tuple[float, float]:
        start = _epoch(body.get("StartTime"), "StartTime")
        end = _epoch(body.get("EndTime"), "EndTime")
        if end <= start:
            raise ApiError("InvalidParameterValue", "EndTime must be after StartTime")
        return start, end

    @staticmethod
    def _period(value: Any) -> int:
        if not isinstance(value, int) or value < 1:
            raise ApiError("InvalidParameterValue", "Period must be a positive number of seconds")
        return value

    def get_metric_statistics(self, body: dict[str, Any]) -> dict[str, Any]:
        start, end = self._window(body)
        period = self._period(body.get("Period"))
        wanted = list(body.get("Statistics") or [])
        unknown = [s for s in wanted if s not in STATISTICS]
        if unknown or not wanted:
            raise ApiError(
                "InvalidParameterValue",
                f"Statistics must name some of {', '.join(STATISTICS)}; got {wanted}",
            )
        if (end - start) / period > MAX_DATAPOINTS:
            raise ApiError(
                "InvalidParameterCombination",
                f"at most {MAX_DATAPOINTS} datapoints per call: use a longer Period",
            )
        points = self._points(body.get("Namespace"), body.get("MetricName"), body.get("Dimensions"))
        datapoints = []
        for at, values in buckets(points, start, end, period):
            point: dict[str, Any] = {
                "Timestamp": dt.datetime.fromtimestamp(at, tz=dt.timezone.utc),
                "Unit": "None",
            }
            point.update({s: statistic(s, values) for s in wanted})
            datapoints.append(point)
        return {"Label": body.get("MetricName") or "", "Datapoints": datapoints}

    def get_metric_data(self, body: dict[str, Any]) -> dict[str, Any]:
        start, end = self._window(body)
        descending = body.get("ScanBy", "TimestampDescending") == "TimestampDescending"
        results = []
        for query in body.get("MetricDataQueries") or []:
            stat_query = query.get("MetricStat")
            if not isinstance(stat_query, dict):
                raise ApiError(
                    "InvalidParameterValue",
                    f"query {query.get('Id')!r}: only MetricStat queries are served "
                    "(no Expression)",
                )
            metric = stat_query.get("Metric") or {}
            stat = stat_query.get("Stat")
            if stat not in STATISTICS:
                raise ApiError(
                    "InvalidParameterValue",
                    f"query {query.get('Id')!r}: Stat must be one of {', '.join(STATISTICS)}",
                )
            period = self._period(stat_query.get("Period"))
            points = self._points(
                metric.get("Namespace"), metric.get("MetricName"), metric.get("Dimensions")
            )
            rows = [(at, statistic(stat, v)) for at, v in buckets(points, start, end, period)]
            if descending:
                rows.reverse()
            results.append(
                {
                    "Id": query.get("Id"),
                    "Label": query.get("Label") or metric.get("MetricName") or "",
                    "Timestamps": [
                        dt.datetime.fromtimestamp(a, tz=dt.timezone.utc) for a, _ in rows
                    ],
                    "Values": [v for _, v in rows],
                    "StatusCode": "Complete",
                }
            )
        return {"MetricDataResults": results, "Messages": []}

    def list_metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body.get("Namespace")
        if namespace not in (None, NAMESPACE):
            return {"Metrics": []}
        wanted = body.get("MetricName")
        filters = {d.get("Name"): d.get("Value") for d in body.get("Dimensions") or []}
        metrics = []
        for dimension, value in self._dimensions():
            if filters and (set(filters) != {dimension} or filters[dimension] not in (None, value)):
                continue
            names = dict.fromkeys(name for name, _, _ in self._series(dimension, value))
            for name in names:
                if wanted in (None, name):
                    metrics.append(
                        {
                            "Namespace": NAMESPACE,
                            "MetricName": name,
                            "Dimensions": [{"Name": dimension, "Value": value}],
                        }
                    )
        return {"Metrics": metrics}


def sources(control: Any) -> tuple[Series, Callable[[], list[tuple[str, str]]]]:
    """The series and dimensions of the jobs of ``control`` (a ControlPlane)."""
    from shipyard.observe import utilization

    def series(dimension: str, value: str) -> list[tuple[str, float, float]]:
        job, _, host = value.partition("/") if dimension == "Host" else (value, "", "")
        if not job or not control.store.exists(job):
            return []
        if dimension == "TrainingJobName":
            return [(p["name"], p["at"], p["value"]) for p in control.store.metrics(job)]
        record = control.store.get(job)
        return [
            (p["name"], p["at"], float(p["value"]))
            for p in utilization.points(utilization.read(record.job_dir))
            if p["host"] == host
        ]

    def dimensions() -> list[tuple[str, str]]:
        out = []
        for record in control.store.list(100):
            out.append(("TrainingJobName", record.name))
            out.extend(("Host", f"{record.name}/{h}") for h in record.spec.hosts)
        return out

    return series, dimensions
