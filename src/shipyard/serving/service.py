"""One model directory, served: /invocations and the TF Serving API over its models.

``load_service`` picks the kind from what the directory holds (or the framework the
caller named): SavedModels -> ``TFService`` (with the TF container's inference.py
handlers if present); otherwise ``PythonService`` (model_fn & co., defaulting to the
PyTorch toolkit's TorchScript loading and array codecs). Both answer with ``Reply``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from shipyard.serving import fast_json, model_data, protocol, user_module
from shipyard.serving.batching import DirectRunner
from shipyard.serving.errors import (
    BadRequest,
    HandlerError,
    ModelLoadError,
    NotFound,
    ServingError,
    UnsupportedMediaType,
)
from shipyard.serving.protocol import body_type, media_type
from shipyard.serving.servables import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    REGRESS_METHOD,
    Registry,
    TorchServable,
    load_tf,
    load_torchscript,
    tf_examples,
    to_numpy,
    torch_predict,
)


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass
class Request:
    """What a handler needs from an HTTP request (the app fills it)."""

    body: bytes
    content_type: str
    accept: str
    custom_attributes: str = ""


def parse_custom_attributes(header: str) -> dict[str, str]:
    """``tfs-model-name=a,tfs-model-version=2,tfs-method=classify`` -> dict."""
    out = {}
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _json(payload: Any, status: int = 200) -> Reply:
    return Reply(status, protocol.dumps(payload))


class Service:
    """Common to both kinds: the registry of servables and the TF Serving API."""

    def __init__(self, runner: DirectRunner) -> None:
        self.registry = Registry()
        self.runner = runner
        # user handlers run here, never on the event loop, which also makes the model
        # calls: a handler that calls back into this server (context.rest_uri) must not
        # block the loop that would answer it
        self.handler_pool = ThreadPoolExecutor(8, thread_name_prefix="handler")
        # per (servable, signature): whether and how fast_json reads its requests, kept
        # with the Signature it was worked out from (a reloaded model may reuse an id)
        self._fits: dict[tuple[int, str], tuple[protocol.Signature, fast_json.Fit | None]] = {}

    # -- TF Serving REST API ------------------------------------------------------------
    async def tfs(self, name: str, version: int | None, method: str, body: bytes) -> Reply:
        if method == "predict":
            payload = await self.fast_predict(name, version, body)
            if payload is not None:
                return _json(payload)
        try:
            request = protocol.loads(body)
        except ValueError as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None
        return _json(await self.tfs_call(name, version, method, request, b'"b64"' in body))

    async def fast_predict(
        self, name: str | None, version: int | None, body: bytes
    ) -> dict[str, Any] | None:
        """A predict request of the common form (``fast_json.py``) read straight into
        its array and answered as ``tfs_call`` would; None when the body is not of that
        form (then ``tfs_call`` reads it, and words any error)."""
        try:
            servable = self.registry.resolve(name, version)
            sig = servable.signature(None)
        except ServingError:  # worded by the general path, in its order of checks
            return None
        key = (id(servable), sig.name)
        known = self._fits.get(key)
        if known is not None and known[0] is sig:
            fitted = known[1]
        else:
            fitted = fast_json.fit(sig)
            self._fits[key] = (sig, fitted)
        if fitted is None:
            return None
        arrays = fast_json.instances(body, fitted)
        if arrays is None:
            return None
        outputs = await self.runner.run(servable, sig.name, arrays)
        return protocol.format_predictions(outputs, True)

    async def tfs_call(
        self, name: str | None, version: int | None, method: str, request: Any, b64: bool = True
    ) -> dict[str, Any]:
        servable = self.registry.resolve(name, version)
        if not isinstance(request, dict):
            raise BadRequest("request body must be a JSON object")
        sig_name = request.get("signature_name")
        if sig_name is not None and not isinstance(sig_name, str):
            raise BadRequest("'signature_name' must be a string")
        sig = servable.signature(sig_name)
        if method == "predict":
            arrays, row = protocol.parse_tfs_request(request, sig, b64)
            outputs = await self.runner.run(servable, sig.name, arrays)
            return protocol.format_predictions(outputs, row)
        if method in ("classify", "regress"):
            outputs = await self.runner.run(servable, sig.name, self._examples(request, sig))
            return (
                protocol.format_classify(outputs)
                if method == "classify"
                else protocol.format_regress(outputs)
            )
        raise NotFound(f"unknown method {method!r}: use predict, classify or regress")

    @staticmethod
    def _examples(request: Any, sig: protocol.Signature) -> dict[str, np.ndarray]:
        """A classify/regress signature (TF1 exports) takes serialized tf.Example protos, as
        TF Serving feeds it; other signatures take the examples' features as inputs."""
        if sig.method in (CLASSIFY_METHOD, REGRESS_METHOD) and len(sig.inputs) == 1:
            ((name, spec),) = sig.inputs.items()
            if spec.dtype == "string":
                return {name: tf_examples(protocol.example_rows(request))}
        return protocol.examples_to_arrays(request, sig)

    def status(self, name: str, version: int | None) -> dict[str, Any]:
        versions = self.registry.models.get(name)
        if not versions or (version is not None and version not in versions):
            self.registry.resolve(name, version)  # raises TF Serving's 404
        chosen = [version] if version is not None else sorted(versions or (), reverse=True)
        return {
            "model_version_status": [
                {
                    "version": str(v),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
                for v in chosen
            ]
        }

    def metadata(self, name: str, version: int | None) -> dict[str, Any]:
        servable = self.registry.resolve(name, version)
        return {
            "model_spec": {
                "name": servable.name,
                "signature_name": "",
                "version": str(servable.version),
            },
            "metadata": {
                "signature_def": {
                    "signature_def": {
                        key: _signature_def(sig) for key, sig in servable.signatures.items()
                    }
                }
            },
        }

    async def invocations(self, req: Request) -> Reply:
        raise NotImplementedError

    async def in_handler_pool(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.handler_pool, fn, *args)
        except ServingError:
            raise
        except RecursionError as exc:  # input nested past Python's limit: the request's doing
            raise BadRequest(
                f"the request is nested too deeply for inference.py to read "
                f"({type(exc).__name__}: {exc}); send flatter data"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the user's code failed: its message only
            raise HandlerError(f"{type(exc).__name__}: {exc}") from None


_DT = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "string": "DT_STRING",
    "bool": "DT_BOOL",
    "uint8": "DT_UINT8",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "float16": "DT_HALF",
    "uint16": "DT_UINT16",
}


def _signature_def(sig: protocol.Signature) -> dict[str, Any]:
    def info(spec: protocol.TensorSpec) -> dict[str, Any]:
        shape = (
            {"dim": [], "unknown_rank": True}
            if spec.shape is None
            else {
                "dim": [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape],
                "unknown_rank": False,
            }
        )
        return {
            "dtype": _DT.get(spec.dtype, spec.dtype.upper()),
            "tensor_shape": shape,
            "name": spec.name,
        }

    return {
        "inputs": {k: info(v) for k, v in sig.inputs.items()},
        "outputs": {k: info(v) for k, v in sig.outputs.items()},
        "method_name": sig.method,
    }


class _TFResponse:
    """What ``requests.post(context.rest_uri, ...)`` would hand output_handler."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.content = body
        self.ok = status < 400
        self.headers = {"Content-Type": "application/json"}

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.content)


class TFService(Service):
    """SavedModels found as TF Serving finds them, plus the TF container's inference.py."""

    def __init__(
        self, model_dir: str, runner: DirectRunner, program: str | None, port: int
    ) -> None:
        super().__init__(runner)
        self.port = port
        for model in model_data.find_tf_models(model_dir).values():
            for version, path in sorted(model.versions.items()):
                self.registry.add(load_tf(model.name, version, path))
        if not self.registry.models:
            raise ModelLoadError(
                "no SavedModel found: TF Serving needs "
                "<model>/<version>/saved_model.pb (e.g. 1/saved_model.pb)"
            )
        module = user_module.load(model_dir, program)
        self.handler = user_module.tf_handlers(module)
        self.input_handler = user_module.function(module, "input_handler")
        self.output_handler = user_module.function(module, "output_handler")
        self.default_name = os.environ.get("SAGEMAKER_TFS_DEFAULT_MODEL_NAME") or None

    async def invocations(self, req: Request) -> Reply:
        attrs = parse_custom_attributes(req.custom_attributes)
        name = attrs.get("tfs-model-name") or self.default_name
        version = _version(attrs.get("tfs-model-version"))
        method = attrs.get("tfs-method", "predict")
        if self.handler or self.input_handler:
            return await self._user_invocation(req, attrs, name, version, method)
        payload = None
        if method == "predict" and body_type(req.content_type) in protocol.JSON_TYPES:
            payload = await self.fast_predict(name, version, req.body)
        if payload is None:
            request = protocol.invocations_to_tfs(req.body, req.content_type)
            payload = await self.tfs_call(name, version, method, request, b'"b64"' in req.body)
        body, ctype = protocol.predictions_as(payload, req.accept)
        return Reply(200, body, ctype)

    async def _user_invocation(
        self,
        req: Request,
        attrs: dict[str, str],
        name: str | None,
        version: int | None,
        method: str,
    ) -> Reply:
        servable = self.registry.resolve(name, version)
        path = (
            f"/v1/models/{servable.name}"
            + (f"/versions/{version}" if version is not None else "")
            + f":{method}"
        )
        context = user_module.Context(
            servable.name,
            str(version) if version is not None else None,
            method,
            f"http://127.0.0.1:{self.port}{path}",
            None,
            None,
            req.custom_attributes,
            body_type(req.content_type),
            media_type(req.accept)
            if media_type(req.accept) not in ("", "*/*")
            else "application/json",
            len(req.body),
        )
        loop = asyncio.get_running_loop()

        def call_model(data: Any) -> _TFResponse:
            """input_handler's output -> TF Serving, in process (the container POSTs it)."""
            text = data if isinstance(data, (bytes, str)) else json.dumps(data)
            try:
                request = json.loads(text)
                payload = asyncio.run_coroutine_threadsafe(
                    self.tfs_call(servable.name, version, method, request), loop
                ).result()
                return _TFResponse(200, protocol.dumps(payload))
            except ValueError as exc:
                return _TFResponse(400, protocol.error_body(f"malformed JSON: {exc}"))
            except ServingError as exc:
                return _TFResponse(exc.status, protocol.error_body(str(exc)))

        def run() -> Any:
            data = io.BytesIO(req.body)
            if self.handler:
                return self.handler(data, context)
            pre, post = self.input_handler, self.output_handler
            assert pre is not None and post is not None  # tf_handlers: both or neither
            return post(call_model(pre(data, context)), context)

        result = await self.in_handler_pool(run)
        return _user_reply(result, context.accept_header)


def _user_reply(result: Any, default_type: str) -> Reply:
    body, ctype = (
        result if isinstance(result, tuple) and len(result) == 2 else (result, default_type)
    )
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif not isinstance(body, (bytes, bytearray)):
        body = protocol.dumps(to_numpy(body).tolist() if hasattr(body, "shape") else body)
    return Reply(200, bytes(body), ctype or default_type)


def _version(value: str | None) -> int | None:
    if value in (None, ""):
        return None
    if not value.isdigit():
        raise BadRequest(f"tfs-model-version must be a number, got {value!r}")
    return int(value)


# -- PyTorch / generic Python (SageMaker inference toolkit) --------------------------------
def decode_array(body: bytes, content_type: str) -> np.ndarray:
    """The toolkit's default decoder: JSON, CSV or NPY -> array (float32 for text)."""
    ctype = body_type(content_type)
    try:
        if ctype == "application/json":
            return np.asarray(protocol.loads(body), dtype=np.float32)
        if ctype == protocol.CSV_TYPE:
            rows = [ln.split(",") for ln in body.decode("utf-8").strip().splitlines() if ln.strip()]
            return np.asarray(rows, dtype=np.float32)
        if ctype == protocol.NPY_TYPE:
            return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        raise BadRequest(f"malformed {ctype} body: {exc}") from None
    raise UnsupportedMediaType(
        f"Unsupported Media Type: {content_type or 'Unknown'}; send "
        "application/json, text/csv or application/x-npy, or define "
        "input_fn in inference.py"
    )


def encode_array(prediction: Any, accept: str) -> tuple[bytes, str]:
    """The toolkit's default encoder: array -> JSON, CSV or NPY."""
    arr = to_numpy(prediction)
    if accept == "application/json":
        return protocol.dumps(arr.tolist()), accept
    if accept == protocol.CSV_TYPE:
        rows = arr.reshape(len(arr), -1) if arr.ndim > 1 else arr.reshape(-1, 1)
        return protocol.encode_csv(rows.tolist()).encode(), accept
    if accept == protocol.NPY_TYPE:
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue(), accept
    raise UnsupportedMediaType(
        f"cannot answer in {accept!r}: accept application/json, text/csv "
        "or application/x-npy, or define output_fn in inference.py"
    )


class PythonService(Service):
    """model_fn / input_fn / predict_fn / output_fn or transform_fn, with defaults."""

    def __init__(
        self, model_dir: str, runner: DirectRunner, program: str | None, torch_defaults: bool
    ) -> None:
        super().__init__(runner)
        module = user_module.load(model_dir, program)
        fn = {n: user_module.function(module, n) for n in user_module.PYTHON_FUNCTIONS}
        if fn["transform_fn"] and (fn["input_fn"] or fn["predict_fn"] or fn["output_fn"]):
            raise ModelLoadError(
                "inference.py defines transform_fn together with input_fn, "
                "predict_fn or output_fn; define transform_fn alone or the others"
            )
        if fn["model_fn"]:
            try:
                self.model = user_module.caller(fn["model_fn"], 1)(model_dir)
            except Exception as exc:  # noqa: BLE001
                raise ModelLoadError(f"model_fn failed: {type(exc).__name__}: {exc}") from None
        elif torch_defaults:
            self.model = load_torchscript(model_dir)
        else:
            raise ModelLoadError(
                "no model found: give a TF SavedModel (<version>/saved_model.pb)"
                ", a TorchScript model.pt, or code/inference.py with model_fn"
            )
        self.input_fn = fn["input_fn"] and user_module.caller(fn["input_fn"], 2)
        self.user_predict = fn["predict_fn"] and user_module.caller(fn["predict_fn"], 2)
        self.output_fn = fn["output_fn"] and user_module.caller(fn["output_fn"], 2)
        self.transform_fn = fn["transform_fn"] and user_module.caller(fn["transform_fn"], 4)
        predict = self.user_predict or (torch_predict if _is_torch(self.model) else None)
        if predict is None and not self.transform_fn:
            if not callable(self.model):
                raise ModelLoadError(
                    "model_fn returned a model that is not callable; define "
                    "predict_fn(data, model) in inference.py"
                )

            def predict(data: Any, model: Any) -> Any:
                return model(data)

        self.torch = _is_torch(self.model)
        self.servable = TorchServable("model", self.model, predict) if predict else None
        if self.servable:
            self.registry.add(self.servable)
        self.default_accept = os.environ.get(
            "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "application/json"
        )

    async def invocations(self, req: Request) -> Reply:
        accept = media_type(req.accept)
        if accept in ("", "*/*"):
            accept = self.default_accept
        if self.transform_fn:
            result = await self.in_handler_pool(
                self.transform_fn, self.model, req.body, req.content_type, accept
            )
            return _user_reply(result, accept)
        if self.input_fn:
            data = await self.in_handler_pool(self.input_fn, req.body, media_type(req.content_type))
        else:
            data = decode_array(req.body, req.content_type)
        if self.user_predict:
            if self.torch and isinstance(data, np.ndarray):
                import torch

                data = torch.from_numpy(data)
            prediction = await self.in_handler_pool(self.user_predict, data, self.model)
        else:
            arr = to_numpy(data)
            assert self.servable is not None  # no transform_fn: a predict function exists
            prediction = (await self.runner.run(self.servable, DEFAULT_SIGNATURE, {"input": arr}))[
                "output"
            ]
        if self.output_fn:
            return _user_reply(
                await self.in_handler_pool(self.output_fn, prediction, accept), accept
            )
        body, ctype = encode_array(prediction, accept)
        return Reply(200, body, ctype)


def _is_torch(model: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def load_service(
    model_dir: str,
    framework: str,
    runner: DirectRunner,
    program: str | None = None,
    port: int = 8080,
) -> Service:
    """The service for ``model_dir``; ModelLoadError says why it cannot be served."""
    if not os.path.isdir(model_dir):
        raise ModelLoadError(f"model directory {model_dir} does not exist")
    model_data.check_tree(model_dir)
    if framework not in ("auto", "tensorflow", "pytorch", "python"):
        raise ModelLoadError(
            f"unknown framework {framework!r}: tensorflow, pytorch, python or auto"
        )
    has_tf = bool(model_data.find_tf_models(model_dir))
    if framework == "tensorflow" or (framework == "auto" and has_tf):
        return TFService(model_dir, runner, program, port)
    return PythonService(model_dir, runner, program, torch_defaults=framework != "python")
