"""Predictor: invoke an endpoint by name (mirrors ``sagemaker.predictor.Predictor``).

Requests go over one kept-alive HTTP connection per thread with TCP_NODELAY, so a
small request costs one round trip on loopback. A non-2xx answer raises ModelError
with the server's message, as InvokeEndpoint's ``ModelError`` does.
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
from typing import Any

from shipyard.control.endpoints import Endpoints
from shipyard.errors import EndpointError, ModelError
from shipyard.sdk.deserializers import (
    BaseDeserializer,
    BytesDeserializer,
    JSONDeserializer,
)
from shipyard.sdk.serializers import BaseSerializer, IdentitySerializer, JSONSerializer

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"


class Predictor:
    """Sends requests to an endpoint by name (``sagemaker.predictor.Predictor``): what
    ``deploy`` returns, or made for an endpoint that already runs
    (``Predictor('my-endpoint')``). Raw bytes in and out unless a serializer and
    deserializer say otherwise."""

    def __init__(
        self,
        endpoint_name: str,
        sagemaker_session: Any = None,
        serializer: BaseSerializer | None = None,
        deserializer: BaseDeserializer | None = None,
        component_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Address an endpoint; the connection opens on the first ``predict``.

        Args:
            endpoint_name: The endpoint's name (``shipyard endpoints`` lists them).
            sagemaker_session: The shipyard.Session whose home records the endpoint.
            serializer: Encodes ``predict``'s data (``JSONSerializer()``,
                ``CSVSerializer()``, ``NumpySerializer()``, ...); default bytes as given.
            deserializer: Decodes the answer (``JSONDeserializer()``, ...); default bytes.
            component_name: An inference component on SageMaker; kept, not used.
            **kwargs: Other SageMaker options; accepted and ignored.
        """
        self.endpoint_name = endpoint_name
        self.sagemaker_session = sagemaker_session
        self.serializer = serializer or IdentitySerializer()
        self.deserializer = deserializer or BytesDeserializer()
        self.component_name = component_name
        home = getattr(sagemaker_session, "home", None)
        self._endpoints = Endpoints(home)
        self._local = threading.local()
        self._address: tuple[str, int] | None = None

    @property
    def content_type(self) -> str:
        """The Content-Type requests are sent with (the serializer's)."""
        return self.serializer.content_type

    @property
    def accept(self) -> tuple[str, ...]:
        """The content types asked for in answers (the deserializer's)."""
        return self.deserializer.accept

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._address is None:
                record = self._endpoints.get(self.endpoint_name)
                if record.status != "InService":
                    raise EndpointError(
                        f"endpoint {self.endpoint_name!r} is {record.status}"
                        + (f": {record.failure_reason}" if record.failure_reason else "")
                    )
                self._address = (record.host, record.port)
            conn = http.client.HTTPConnection(*self._address, timeout=60)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def _request(self, path: str, body: Any, headers: dict[str, str]) -> tuple[int, str, bytes]:
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.getheader("Content-Type", ""), resp.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def predict(
        self,
        data: Any,
        initial_args: dict[str, str] | None = None,
        target_model: str | None = None,
        target_variant: str | None = None,
        inference_id: str | None = None,
        custom_attributes: str | None = None,
        component_name: str | None = None,
    ) -> Any:
        """One inference: ``data`` is serialized, sent to the endpoint's ``/invocations``
        and the answer deserialized (SageMaker's InvokeEndpoint).

        Args:
            data: What the serializer encodes (a list, an array, a string, bytes, ...).
            initial_args: InvokeEndpoint's fields: ``ContentType``, ``Accept``,
                ``CustomAttributes`` or a ready ``Body`` (sent as it is).
            target_model: The model of a multi-model endpoint
                (``X-Amzn-SageMaker-Target-Model``).
            target_variant: A production variant on SageMaker; accepted and ignored.
            inference_id: SageMaker's data-capture id; accepted and ignored.
            custom_attributes: Passed to the model server as
                ``X-Amzn-SageMaker-Custom-Attributes``.
            component_name: An inference component on SageMaker; accepted and ignored.

        Raises:
            ModelError: the model server answered an error (its status and message).
            EndpointError: the endpoint is not InService.
        """
        args = dict(initial_args or {})
        raw = args.pop("Body", None)
        if raw is None:
            raw = self.serializer.serialize(data)
        body: bytes = raw.encode("utf-8") if isinstance(raw, str) else raw
        headers = {
            "Content-Type": args.get("ContentType", self.content_type),
            "Accept": args.get("Accept", ", ".join(self.accept)),
        }
        attrs = custom_attributes or args.get("CustomAttributes")
        if attrs:
            headers[CUSTOM_ATTRIBUTES] = attrs
        if target_model:
            headers["X-Amzn-SageMaker-Target-Model"] = target_model
        status, ctype, payload = self._request("/invocations", body, headers)
        if status >= 300:
            raise ModelError(status, _message(payload), self.endpoint_name)
        return self.deserializer.deserialize(io.BytesIO(payload), ctype)

    def delete_endpoint(self, delete_endpoint_config: bool = True) -> None:
        """Stop the endpoint's model server and forget the endpoint; nothing is left
        running.

        Args:
            delete_endpoint_config: SageMaker's argument; there is no separate endpoint
                configuration here.
        """
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._endpoints.delete(self.endpoint_name)

    def delete_model(self) -> None:
        """Models are not kept apart from endpoints here; nothing to delete."""

    def describe(self) -> dict[str, Any]:
        """The endpoint as DescribeEndpoint shapes it (``EndpointStatus``, ...)."""
        return self._endpoints.get(self.endpoint_name).describe()


def _message(payload: bytes) -> str:
    import json

    try:
        data = json.loads(payload)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return payload.decode("utf-8", "replace")[:1000]


class TensorFlowPredictor(Predictor):
    """JSON in and out; ``model_name``/``model_version`` pick a TF Serving model by the
    tfs-model-name/tfs-model-version custom attributes; classify/regress by tfs-method."""

    def __init__(
        self,
        endpoint_name: str,
        sagemaker_session: Any = None,
        serializer: BaseSerializer | None = None,
        deserializer: BaseDeserializer | None = None,
        model_name: str | None = None,
        model_version: str | None = None,
        component_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Address a TensorFlow Serving endpoint; JSON in and out unless told otherwise.

        Args:
            endpoint_name: The endpoint's name.
            sagemaker_session: The shipyard.Session whose home records the endpoint.
            serializer: Default ``JSONSerializer()``.
            deserializer: Default ``JSONDeserializer()``.
            model_name: The TF Serving model to ask (``tfs-model-name``), for an endpoint
                serving several.
            model_version: The model version to ask (``tfs-model-version``).
            component_name: An inference component on SageMaker; kept, not used.
            **kwargs: Other SageMaker options; accepted and ignored.
        """
        super().__init__(
            endpoint_name,
            sagemaker_session,
            serializer or JSONSerializer(),
            deserializer or JSONDeserializer(),
            component_name,
        )
        self._model_attributes = ",".join(
            f"{k}={v}"
            for k, v in (("tfs-model-name", model_name), ("tfs-model-version", model_version))
            if v
        )

    def classify(self, data: Any) -> Any:
        """TF Serving's ``:classify``; JSON requests only.

        Args:
            data: The request, ``{'signature_name': ..., 'examples': [...]}``.
        """
        return self._classify_or_regress(data, "classify")

    def regress(self, data: Any) -> Any:
        """TF Serving's ``:regress``; JSON requests only.

        Args:
            data: The request, ``{'signature_name': ..., 'examples': [...]}``.
        """
        return self._classify_or_regress(data, "regress")

    def _classify_or_regress(self, data: Any, method: str) -> Any:
        if self.content_type != "application/json":
            raise ValueError(f"The {method} api requires json requests.")
        return self.predict(data, {"CustomAttributes": f"tfs-method={method}"})

    def predict(  # type: ignore[override]  # forwards SageMaker's optional keywords as given
        self, data: Any, initial_args: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        """As Predictor.predict, asking the model and version given to the constructor.

        Forwards: Predictor.predict
        """
        args = dict(initial_args or {})
        if self._model_attributes:
            args["CustomAttributes"] = ",".join(
                a for a in (self._model_attributes, args.get("CustomAttributes")) if a
            )
        return super().predict(data, args, **kwargs)


class PyTorchPredictor(Predictor):
    """NumPy in and out, as ``sagemaker.pytorch.PyTorchPredictor``."""

    def __init__(
        self,
        endpoint_name: str,
        sagemaker_session: Any = None,
        serializer: BaseSerializer | None = None,
        deserializer: BaseDeserializer | None = None,
        component_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Address a PyTorch endpoint; NumPy arrays in and out unless told otherwise.

        Args:
            endpoint_name: The endpoint's name.
            sagemaker_session: The shipyard.Session whose home records the endpoint.
            serializer: Default ``NumpySerializer()``.
            deserializer: Default ``NumpyDeserializer()``.
            component_name: An inference component on SageMaker; kept, not used.
            **kwargs: Other SageMaker options; accepted and ignored.
        """
        from shipyard.sdk.deserializers import NumpyDeserializer
        from shipyard.sdk.serializers import NumpySerializer

        super().__init__(
            endpoint_name,
            sagemaker_session,
            serializer or NumpySerializer(),
            deserializer or NumpyDeserializer(),
            component_name,
        )
