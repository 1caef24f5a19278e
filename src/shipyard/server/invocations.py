"""sagemaker-runtime InvokeEndpoint: the request forwarded to the endpoint's model server.

``POST /endpoints/<name>/invocations`` with the body, ``Content-Type``, ``Accept`` and
``X-Amzn-SageMaker-Custom-Attributes`` (the TF Serving predictor sends
``tfs-method=predict`` etc. there) is sent to the server's ``/invocations``; its answer
comes back with ``x-Amzn-Invoked-Production-Variant``. A model that answers an error is
SageMaker's ModelError (424) carrying the model's status and message; a missing or
unhealthy endpoint is a ValidationError naming it, as the real service answers. A body
over the endpoint's payload limit (hosting.payload_limit: SageMaker's 6 MB unless the
model's Environment raises it) is refused before it is read. The headers that carry the
operation's members (ContentType, Accept, CustomAttributes, TargetModel, TargetVariant,
InferenceId, ...) and the endpoint's name are checked against botocore's sagemaker-runtime
model first: a bad one is a 400 ValidationError naming the member, as SageMaker answers.
"""

from __future__ import annotations

import http.client
import urllib.parse

from shipyard.server.contract import Contract
from shipyard.server.errors import ApiError
from shipyard.server.hosting import HostingApi
from shipyard.server.http import Request, Response
from shipyard.server.identity import ACCOUNT
from shipyard.server.sigv4 import wire_text

_FORWARD = ("content-type", "accept", "x-amzn-sagemaker-custom-attributes")


class RuntimeApi:
    def __init__(self, hosting: HostingApi) -> None:
        self.hosting = hosting
        # InvokeEndpoint's headers and endpoint name against botocore's sagemaker-runtime
        # model (lengths, patterns), answered as that service does: 400 ValidationError
        self.contract = Contract("sagemaker-runtime", {"InvokeEndpoint"}, "ValidationError")

    def read_invocation(self, req: Request, name: str) -> bytes:
        """An invocation's body, up to its endpoint's payload limit (413 beyond, nothing
        read). Also called before the request's signature is checked, since the signature
        covers the body: so the endpoint's own limit applies there too, not the API's."""
        return req.read_body(
            self.hosting.payload_limit(name),
            "ValidationError",
            f" by endpoint {name} (SageMaker's real-time limit is 6 MB; a model raises it "
            "with SAGEMAKER_MAX_PAYLOAD_IN_MB in its Environment)",
        )

    def preread(self, req: Request) -> None:
        """For ``POST /endpoints/NAME/invocations`` of a known endpoint: read its body now,
        with that endpoint's limit (the signature check then hashes what was read)."""
        parts = req.raw_path.strip("/").split("/")
        if req.method != "POST" or len(parts) != 3 or parts[0] != "endpoints":
            return
        if parts[2] != "invocations" or req.length < 0:
            return
        name = urllib.parse.unquote(parts[1])
        if self.hosting.records.get("endpoint", name) is not None:
            req.service = "sagemaker-runtime"  # the shape of a 413 raised here
            self.read_invocation(req, name)

    def handle(self, req: Request) -> Response:
        parts = req.raw_path.strip("/").split("/")
        if (
            req.method != "POST"
            or len(parts) != 3
            or parts[0] != "endpoints"
            or parts[2] != "invocations"
        ):
            raise ApiError(
                "UnknownOperationException", f"{req.method} {req.raw_path} is not served"
            )
        name = urllib.parse.unquote(parts[1])
        sent = {k: wire_text(v) for k, v in req.headers.items()}  # as the client wrote them
        params = self.contract.rest_input("InvokeEndpoint", sent, {"EndpointName": name})
        self.contract.validate("InvokeEndpoint", params)
        if self.hosting.records.get("endpoint", name) is None:
            raise ApiError("ValidationError", f"Endpoint {name} of account {ACCOUNT} not found.")
        status, reason, record = self.hosting.status(name)
        if status != "InService" or record is None:
            why = f": {reason}" if reason else ""
            raise ApiError(
                "ValidationError",
                f"Endpoint {name} of account {ACCOUNT} is not InService (it is {status}{why}).",
            )
        body = self.read_invocation(req, name)
        headers = {k: v for k, v in req.headers.items() if k in _FORWARD}
        headers.setdefault("content-type", "application/octet-stream")
        headers["content-length"] = str(len(body))
        conn = http.client.HTTPConnection(record.host, record.port, timeout=60)
        try:
            conn.request("POST", "/invocations", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            content_type = resp.getheader("Content-Type", "application/json")
            custom = resp.getheader("X-Amzn-SageMaker-Custom-Attributes")
        except OSError as exc:
            raise ApiError(
                "ServiceUnavailable", f"endpoint {name}'s model server did not answer: {exc}", 503
            ) from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise ApiError(
                "ModelError",
                f"Received client error ({resp.status}) from primary with message "
                f'"{data.decode("utf-8", "replace")[:1024]}". See the endpoint log '
                f"(shipyard endpoints, or CloudWatch group /aws/sagemaker/Endpoints/{name}).",
                424,
            )
        out = {"Content-Type": content_type, "x-Amzn-Invoked-Production-Variant": "AllTraffic"}
        if custom:
            out["X-Amzn-SageMaker-Custom-Attributes"] = custom
        return Response(200, data, out)
