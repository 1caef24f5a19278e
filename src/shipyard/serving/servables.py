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

from shipyard.serving.errors import BadRequest, ModelLoadError, NotFound
from shipyard.serving.protocol import Signature, TensorSpec

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
            raise BadRequest(f"Serving signature name: {key!r} not found in signature def; "
                             f"model {self.name!r} has {sorted(self.signatures)}")
        return self.signatures[key]

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError


# -- TensorFlow SavedModel -------------------------------------------------------------------
def _tf_dtype(dtype: Any) -> str:
    return "string" if dtype.name == "string" else dtype.as_numpy_dtype().dtype.name


def _tf_spec(name: str, spec: Any) -> TensorSpec:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorSpec(name, _tf_dtype(spec.dtype), shape)


class TFServable(Servable):
    """A SavedModel's signatures, called as concrete functions (no TF Serving binary)."""

    def __init__(self, name: str, version: int, path: str) -> None:
        import tensorflow as tf

        self._tf = tf
        try:
            loaded = tf.saved_model.load(path)
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's fault
            raise ModelLoadError(f"could not load SavedModel {name}/{version} from {path}: "
                                 f"{type(exc).__name__}: {str(exc)[:500]}") from None
        self._loaded = loaded  # keeps the variables alive
        self._functions = dict(loaded.signatures)
        if not self._functions:
            raise ModelLoadError(f"SavedModel {path} has no serving signatures; export it with "
                                 "model.export(...) or tf.saved_model.save(..., signatures=...)")
        sigs = {}
        for key, fn in self._functions.items():
            _, kwargs = fn.structured_input_signature
            inputs = {k: _tf_spec(k, s) for k, s in sorted(kwargs.items())}
            outputs = {k: _tf_spec(k, s) for k, s in sorted(fn.structured_outputs.items())}
            sigs[key] = Signature(key, inputs, outputs)
        super().__init__(name, version, sigs)

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        fn = self._functions[signature]
        try:
            result = fn(**{k: tf.constant(v) for k, v in inputs.items()})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            msg = getattr(exc, "message", None) or str(exc)
            raise BadRequest(f"{msg.strip().splitlines()[0][:300]}; expected "
                             f"{self.signatures[signature].describe()}") from None
        return {k: result[k].numpy() for k in self.signatures[signature].outputs}


# -- PyTorch -----------------------------------------------------------------------------------
TORCH_SIGNATURE = Signature(DEFAULT_SIGNATURE, {"input": TensorSpec("input", "float32", None)},
                            {"output": TensorSpec("output", "float32", None)})


def torch_device() -> str:
    """``cuda`` when a GPU is visible (as the SageMaker PyTorch toolkit picks), unless
    SHIPYARD_SERVING_DEVICE=cpu. The CUDA path is not exercised by the CPU-only CI."""
    import torch

    if os.environ.get("SHIPYARD_SERVING_DEVICE", "").lower() == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_torchscript(model_dir: str) -> Any:
    """The default PyTorch model_fn: ``model.pt`` or the one .pt/.pth file, as TorchScript."""
    import torch

    path = os.path.join(model_dir, "model.pt")
    if not os.path.exists(path):
        files = sorted(f for f in os.listdir(model_dir) if f.endswith((".pt", ".pth")))
        if len(files) != 1:
            raise ModelLoadError(f"exactly one .pt or .pth file is needed for a PyTorch model "
                                 f"without model_fn; found {files} in the model directory")
        path = os.path.join(model_dir, files[0])
    try:
        return torch.jit.load(path, map_location=torch_device())
    except Exception:  # noqa: BLE001
        raise ModelLoadError(
            f"{os.path.basename(path)} is not TorchScript (a state_dict?): save it with "
            "torch.jit.save(torch.jit.script(model), ...) or give an inference.py whose "
            "model_fn(model_dir) builds the model and loads the state_dict") from None


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

    def __init__(self, name: str, model: Any,
                 predict_fn: Callable[[Any, Any], Any] | None = None) -> None:
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
            raise BadRequest(f"the model refused an input of shape {list(arr.shape)} and "
                             f"dtype {arr.dtype}: {type(exc).__name__}: {first}") from None
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
                raise NotFound(f"this endpoint serves several models {sorted(self.models)}: "
                               "name one (custom attribute tfs-model-name=<name>)")
            name = next(iter(self.models))
        versions = self.models.get(name)
        if not versions or (version is not None and version not in versions):
            spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise NotFound(f"Servable not found for request: {spec}")
        return versions[max(versions) if version is None else version]
