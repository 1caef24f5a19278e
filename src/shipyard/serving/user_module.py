"""The user's ``inference.py``: loading it and calling its functions by the SageMaker rules.

Contracts (SageMaker TF Serving container ``python_service.py``; inference toolkit
``transformer.py``):

* TensorFlow: ``handler(data, context)`` (wins), or both ``input_handler(data, context)``
  and ``output_handler(response, context)``; each returns ``(body, content_type)``.
* PyTorch / generic: ``model_fn(model_dir)``, ``input_fn(body, content_type)``,
  ``predict_fn(data, model)``, ``output_fn(prediction, accept)``, or ``transform_fn(model,
  body, content_type, accept)`` instead of the last three. Each may take one extra
  trailing ``context`` argument.

``code/lib`` and ``code/`` go on sys.path (lib first), as the containers do.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections import namedtuple
from collections.abc import Callable
from types import ModuleType
from typing import Any

from shipyard.serving.errors import ModelLoadError

Context = namedtuple(
    "Context",
    "model_name model_version method rest_uri grpc_port channel "
    "custom_attributes request_content_type accept_header content_length",
)

PYTHON_FUNCTIONS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
TF_FUNCTIONS = ("handler", "input_handler", "output_handler")


def load(model_dir: str, program: str | None) -> ModuleType | None:
    """Import ``code/<program>`` (default inference.py) from the model, or None if absent."""
    code_dir = os.path.join(model_dir, "code")
    name = program or os.environ.get("SAGEMAKER_PROGRAM") or "inference.py"
    path = os.path.join(code_dir, name)
    if not os.path.isfile(path):
        if program:
            raise ModelLoadError(
                f"entry point {program!r} not found in the model's code/ directory"
            )
        return None
    for extra in (code_dir, os.path.join(code_dir, "lib")):
        if os.path.isdir(extra) and extra not in sys.path:
            sys.path.insert(0, extra)
    spec = importlib.util.spec_from_file_location(os.path.splitext(name)[0], path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{name} is not a Python module Python can import (from {path})")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's import failed: say so, no trace
        raise ModelLoadError(f"importing {name} failed: {type(exc).__name__}: {exc}") from None
    return module


def function(module: ModuleType | None, name: str) -> Callable[..., Any] | None:
    fn = getattr(module, name, None) if module is not None else None
    return fn if callable(fn) else None


def caller(fn: Callable[..., Any], base_args: int) -> Callable[..., Any]:
    """Call ``fn`` with its base arguments, plus ``context`` if it takes one more."""
    try:
        params = inspect.signature(fn).parameters.values()
        takes_context = (
            sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) > base_args
        )
    except (TypeError, ValueError):
        takes_context = False
    if takes_context:
        return lambda *args, context=None: fn(*args, context)
    return lambda *args, context=None: fn(*args)


def tf_handlers(module: ModuleType | None) -> Callable[[Any, Context], Any] | None:
    """The TF container's handler: ``handler`` or the input/output pair, or None."""
    handler = function(module, "handler")
    if handler:
        return handler
    pre, post = function(module, "input_handler"), function(module, "output_handler")
    if bool(pre) != bool(post):
        raise ModelLoadError(
            "inference.py must define both input_handler and output_handler "
            "(or handler); it defines only " + ("input_handler" if pre else "output_handler")
        )
    return None
