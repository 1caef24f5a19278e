"""Loaded models behind one interface: ``run(signature, arrays) -> arrays``.

A ``Servable`` is one version of one model. The TF Serving API, /invocations and the
batcher all go through ``run``; frameworks are imported only when a model of theirs
is loaded, so a PyTorch endpoint never imports TensorFlow and vice versa.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from shipyard import settings
from shipyard.runtime.tf_import import import_tensorflow
from shipyard.serving.errors import BadRequest, ModelLoadError, NotFound
from shipyard.serving.protocol import Signature, TensorSpec
from shipyard.serving.tf_eager import DirectCall, warn_if_untested

DEFAULT_SIGNATURE = "serving_default"


class Servable:
    """One model version: its signatures and a blocking ``run``."""

    def __init__(self, name: str, version: int, signatures: dict[str, Signature]) -> None:
        self.name = name
        self.version = version
        self.signatures = signatures

    def signature(self, name: str | None) -> Signature:
        key = name or DEFAULT_SIGNATURE
        if key not in self.signatures:
            if not name and len(self.signatures) == 1:
                return next(iter(self.signatures.values()))
            raise BadRequest(
                f"Serving signature name: {key!r} not found in signature def; "
                f"model {self.name!r} has {sorted(self.signatures)}"
            )
        return self.signatures[key]

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError


# -- TensorFlow SavedModel -------------------------------------------------------------------
def _tf_dtype(dtype: Any) -> str:
    return "string" if dtype.name == "string" else dtype.as_numpy_dtype().dtype.name


def _tf_spec(name: str, spec: Any) -> TensorSpec:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorSpec(name, _tf_dtype(spec.dtype), shape)


def _sample(spec: TensorSpec, index: int) -> np.ndarray | None:
    """A one-row input for ``spec`` (unknown dimensions 1) filled with a value of its own
    (``index + 1``, so that two inputs swapped would show), or None when the input has no
    fixed rank or is a string."""
    if spec.shape is None or spec.dtype == "string":
        return None
    return np.full([1 if d is None else d for d in spec.shape], index + 1, dtype=spec.dtype)


class TFServable(Servable):
    """A SavedModel's signatures, called as concrete functions (no TF Serving binary)."""

    def __init__(self, name: str, version: int, path: str) -> None:
        tf = import_tensorflow()  # without Keras: signatures need none (runtime/tf_import.py)
        warn_if_untested(tf.__version__)
        self._tf = tf
        try:
            loaded = tf.saved_model.load(path)
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's fault
            raise ModelLoadError(
                f"could not load SavedModel {name}/{version} from {path}: "
                f"{type(exc).__name__}: {str(exc)[:500]}"
            ) from None
        self._loaded = loaded  # keeps the variables alive
        self._functions = dict(loaded.signatures)
        if not self._functions:
            raise ModelLoadError(
                f"SavedModel {path} has no serving signatures; export it with "
                "model.export(...) or tf.saved_model.save(..., signatures=...)"
            )
        sigs = {}
        for key, fn in self._functions.items():
            _, kwargs = fn.structured_input_signature
            inputs = {k: _tf_spec(k, s) for k, s in sorted(kwargs.items())}
            outputs = {k: _tf_spec(k, s) for k, s in sorted(fn.structured_outputs.items())}
            sigs[key] = Signature(key, inputs, outputs)
        super().__init__(name, version, sigs)
        self._direct = {key: d for key in sigs if (d := self._direct_call(key)) is not None}

    def _direct_call(self, key: str) -> DirectCall | None:
        """The signature's direct call when it checks out against ``fn(**inputs)``."""
        sig = self.signatures[key]
        maybe = {k: _sample(spec, i) for i, (k, spec) in enumerate(sig.inputs.items())}
        samples = {k: v for k, v in maybe.items() if v is not None}
        if len(samples) != len(maybe):
            return None
        try:
            direct = DirectCall(self._functions[key], list(sig.inputs), list(sig.outputs))
            got = direct(samples)
            want = self._call(key, samples)
        except Exception:  # noqa: BLE001 - TF internals moved, or an odd signature: the plain call
            return None
        same = set(got) == set(want) and all(
            got[k].dtype == want[k].dtype
            and got[k].shape == want[k].shape
            and np.array_equal(got[k], want[k], equal_nan=got[k].dtype.kind in "fc")
            for k in want
        )
        return direct if same else None

    def _call(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        result = self._functions[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: result[k].numpy() for k in self.signatures[signature].outputs}

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        direct = self._direct.get(signature)
        if direct is not None and inputs.keys() == self.signatures[signature].inputs.keys():
            try:
                return direct(inputs)
            except Exception:  # noqa: BLE001,S110 - the plain call below answers (and words the error)
                pass
        tf = self._tf
        try:
            return self._call(signature, inputs)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            msg = getattr(exc, "message", None) or str(exc)
            raise BadRequest(
                f"{msg.strip().splitlines()[0][:300]}; expected "
                f"{self.signatures[signature].describe()}"
            ) from None


# -- TF1 SavedModels: the session loader TF Serving itself uses ---------------------------------
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
SERVE_TAG = "serve"


def is_tf1_saved_model(path: str) -> bool:
    """A SavedModel exported by TF1 (``tf.compat.v1.saved_model.Builder``, Estimator
    exports): no object graph, only a graph and signature defs. TF2's loader rebuilds those
    as functions (``load_v1_in_v2``) and fails on some of them; TF Serving runs the graph."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(path, "saved_model.pb")
    if not os.path.isfile(pb):
        return False  # saved_model.pbtxt and the like: TF2's loader says what is wrong
    model = saved_model_pb2.SavedModel()
    try:
        with open(pb, "rb") as fh:
            model.ParseFromString(fh.read())
    except Exception:  # noqa: BLE001 - a corrupt file: the TF2 loader words the error
        return False
    return bool(model.meta_graphs) and not any(m.object_graph_def.nodes for m in model.meta_graphs)


class TF1Servable(Servable):
    """A TF1 SavedModel served as TF Serving serves it: its ``serve`` meta graph loaded
    into a session (``tf.compat.v1.saved_model.loader.load``), signatures run by feeding
    and fetching the tensors their signature defs name. ``Session.run`` is thread-safe."""

    def __init__(self, name: str, version: int, path: str) -> None:
        tf = import_tensorflow()
        v1 = tf.compat.v1
        self._tf = tf
        self._session = v1.Session(graph=tf.Graph())
        try:
            meta = v1.saved_model.loader.load(self._session, [SERVE_TAG], path)
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's fault
            self._session.close()
            raise ModelLoadError(
                f"could not load TF1 SavedModel {name}/{version} from {path} (tag "
                f"{SERVE_TAG!r}): {type(exc).__name__}: {str(exc)[:500]}"
            ) from None
        self._feeds: dict[str, dict[str, str]] = {}
        self._fetches: dict[str, dict[str, str]] = {}
        sigs = {}
        for key, sd in sorted(meta.signature_def.items()):
            infos = list(sd.inputs.items()) + list(sd.outputs.items())
            if any(not info.name for _, info in infos):
                continue  # sparse/composite tensors: not servable over REST
            inputs = {k: self._spec(k, info) for k, info in sorted(sd.inputs.items())}
            outputs = {k: self._spec(k, info) for k, info in sorted(sd.outputs.items())}
            sigs[key] = Signature(key, inputs, outputs, method=sd.method_name or "")
            self._feeds[key] = {k: info.name for k, info in sd.inputs.items()}
            self._fetches[key] = {k: info.name for k, info in sd.outputs.items()}
        if not sigs:
            raise ModelLoadError(f"TF1 SavedModel {path} has no servable signature defs")
        super().__init__(name, version, sigs)

    def _spec(self, name: str, info: Any) -> TensorSpec:
        """A signature tensor's spec. A TensorInfo without ``tensor_shape`` (early TF1
        exporters wrote none, e.g. TF Serving's ``half_plus_three``) declares no shape: the
        empty proto would read as a scalar, so the graph's own tensor says it instead
        (a placeholder of no shape: any rank), as TF Serving feeds it."""
        tf = self._tf
        if info.HasField("tensor_shape"):
            shape = tf.TensorShape(info.tensor_shape)
        else:
            try:
                shape = self._session.graph.get_tensor_by_name(info.name).shape
            except (KeyError, ValueError):
                shape = tf.TensorShape(None)
        dims = None if shape.rank is None else tuple(shape.as_list())
        return TensorSpec(name, _tf_dtype(tf.dtypes.as_dtype(info.dtype)), dims, strict=False)

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        feeds = self._feeds[signature]
        try:
            return self._run_as_tf_serving(
                self._fetches[signature], {feeds[k]: v for k, v in inputs.items()}
            )
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            msg = getattr(exc, "message", None) or str(exc)
            raise BadRequest(
                f"{msg.strip().splitlines()[0][:300]}; expected "
                f"{self.signatures[signature].describe()}"
            ) from None

    def _run_as_tf_serving(
        self, fetches: dict[str, str], feeds: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """One run through the C++ session, as TF Serving runs it. Python's ``Session.run``
        first refuses a value whose shape differs from the fed tensor's static shape; TF
        Serving's C++ session does not, and models rely on it: the SageMaker SDK's
        ``half_plus_three`` declares ``x`` as ``[-1, 1]`` (an identity over parsed
        examples) and answers ``{"instances": [1.0, 2.0, 5.0]}`` with ``[3.5, 4.0, 5.5]``.
        ``_call_tf_sessionrun`` is the client's own C++ call (TensorFlow 1.5 to 2.21);
        where a TensorFlow lacks it, the checked public ``run``."""
        session = self._session
        call = getattr(session, "_call_tf_sessionrun", None)
        if call is None:
            return session.run(fetches, feeds)
        graph = session.graph
        feed_outputs = {}
        for name, value in feeds.items():
            tensor = graph.get_tensor_by_name(name)
            if not graph.is_feedable(tensor):
                raise ValueError(f"Tensor {name} may not be fed.")
            feed_outputs[tensor._as_tf_output()] = np.asarray(  # noqa: SLF001
                value, dtype=tensor.dtype.as_numpy_dtype
            )
        keys = list(fetches)
        fetch_outputs = [graph.get_tensor_by_name(fetches[k])._as_tf_output() for k in keys]  # noqa: SLF001
        results = call(None, feed_outputs, fetch_outputs, [], None)
        return dict(zip(keys, results))


def load_tf(name: str, version: int, path: str) -> Servable:
    """A TF1 SavedModel through the session loader (as TF Serving does); any other through
    ``tf.saved_model.load``, and through the session loader when that cannot load it."""
    if is_tf1_saved_model(path):
        return TF1Servable(name, version, path)
    try:
        return TFServable(name, version, path)
    except ModelLoadError as tf2_error:
        try:
            return TF1Servable(name, version, path)
        except ModelLoadError:
            raise tf2_error from None


def tf_examples(rows: list[dict[str, Any]]) -> np.ndarray:
    """Classify/regress examples as TF Serving's REST API turns them into ``tf.Example``:
    per feature, strings (and ``{"b64"}`` bytes) a bytes_list, integers an int64_list,
    numbers with a fraction a float_list; a scalar is a list of one. Serialized, one per row."""
    from tensorflow.core.example import example_pb2, feature_pb2

    out = []
    for row in rows:
        features = {}
        for key, value in row.items():
            values = value if isinstance(value, list) else [value]
            feature = feature_pb2.Feature()
            if all(isinstance(v, (bytes, str)) for v in values):
                feature.bytes_list.value.extend(
                    v if isinstance(v, bytes) else v.encode("utf-8") for v in values
                )
            elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                feature.int64_list.value.extend(values)
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                feature.float_list.value.extend(float(v) for v in values)
            else:
                raise BadRequest(
                    f"feature {key!r}: a tf.Example feature is a list of numbers or of "
                    f"strings, got {value!r}"
                )
            features[key] = feature
        example = example_pb2.Example(features=feature_pb2.Features(feature=features))
        out.append(example.SerializeToString())
    return np.array(out, dtype=object)


# -- PyTorch -----------------------------------------------------------------------------------
TORCH_SIGNATURE = Signature(
    DEFAULT_SIGNATURE,
    {"input": TensorSpec("input", "float32", None)},
    {"output": TensorSpec("output", "float32", None)},
)


def torch_device() -> str:
    """``cuda`` when a GPU is visible (as the SageMaker PyTorch toolkit picks), unless
    SHIPYARD_SERVING_DEVICE=cpu. The CUDA path is not exercised by the CPU-only CI."""
    import torch

    if (settings.optional_text("SHIPYARD_SERVING_DEVICE") or "").lower() == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_torchscript(model_dir: str) -> Any:
    """The default PyTorch model_fn: ``model.pt`` or the one .pt/.pth file, as TorchScript."""
    import torch

    path = os.path.join(model_dir, "model.pt")
    if not os.path.exists(path):
        files = sorted(f for f in os.listdir(model_dir) if f.endswith((".pt", ".pth")))
        if len(files) != 1:
            raise ModelLoadError(
                f"exactly one .pt or .pth file is needed for a PyTorch model "
                f"without model_fn; found {files} in the model directory"
            )
        path = os.path.join(model_dir, files[0])
    try:
        return torch.jit.load(path, map_location=torch_device())
    except Exception:  # noqa: BLE001
        raise ModelLoadError(
            f"{os.path.basename(path)} is not TorchScript (a state_dict?): save it with "
            "torch.jit.save(torch.jit.script(model), ...) or give an inference.py whose "
            "model_fn(model_dir) builds the model and loads the state_dict"
        ) from None


def torch_predict(data: Any, model: Any) -> Any:
    """The PyTorch toolkit's default predict_fn: eval mode, no grad."""
    import torch

    if hasattr(model, "eval"):
        model.eval()
    device = _device_of(model)
    if device is not None and hasattr(data, "to") and data.device != device:
        data = data.to(device)  # GPU models: inputs follow the model; outputs come back
    with torch.inference_mode():
        return model(data)


def _device_of(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return None


class TorchServable(Servable):
    """A PyTorch model (any callable) with one tensor in, one out."""

    def __init__(
        self, name: str, model: Any, predict_fn: Callable[[Any, Any], Any] | None = None
    ) -> None:
        super().__init__(name, 1, {DEFAULT_SIGNATURE: TORCH_SIGNATURE})
        import torch

        self._torch = torch
        self.model = model
        self.predict_fn = predict_fn or torch_predict
        if hasattr(model, "eval"):
            model.eval()

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (arr,) = inputs.values()
        data = self._torch.from_numpy(np.ascontiguousarray(arr))
        if self.predict_fn is not torch_predict:
            return {"output": to_numpy(self.predict_fn(data, self.model))}
        try:
            out = torch_predict(data, self.model)
        except (RuntimeError, TypeError, ValueError) as exc:
            # the default predict only feeds the client's tensor to the model: a shape or
            # dtype the model refuses is the request's fault
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise BadRequest(
                f"the model refused an input of shape {list(arr.shape)} and "
                f"dtype {arr.dtype}: {type(exc).__name__}: {first}"
            ) from None
        return {"output": to_numpy(out)}


def to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class Registry:
    """Models by name and version, resolved as TF Serving does (latest when unspecified)."""

    def __init__(self) -> None:
        self.models: dict[str, dict[int, Servable]] = {}

    def add(self, servable: Servable) -> None:
        self.models.setdefault(servable.name, {})[servable.version] = servable

    def resolve(self, name: str | None, version: int | None = None) -> Servable:
        if name is None:
            if len(self.models) != 1:
                raise NotFound(
                    f"this endpoint serves several models {sorted(self.models)}: "
                    "name one (custom attribute tfs-model-name=<name>)"
                )
            name = next(iter(self.models))
        versions = self.models.get(name)
        if not versions or (version is not None and version not in versions):
            spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise NotFound(f"Servable not found for request: {spec}")
        return versions[max(versions) if version is None else version]
