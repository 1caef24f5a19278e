"""TensorFlow "legacy mode" scripts, refused at submission with what to do instead.

Before script mode (TF <= 1.11 containers), a SageMaker TensorFlow entry point only defined
functions (``keras_model_fn`` or ``estimator_fn``/``model_fn``, ``train_input_fn``,
``serving_input_fn``...) and the container called them. SageMaker SDK v2 dropped that mode:
the file is run as a program, so such a script does nothing, exits 0, and the job "completes"
with an empty model. Public examples still carry the form, so a script that defines these
functions and has no code that runs is refused, naming legacy mode.
"""

from __future__ import annotations

import ast
import tarfile

from shipyard.errors import ValidationError

# What marks a legacy-mode script (model_fn alone is also an inference handler's name).
MARKERS = ("keras_model_fn", "estimator_fn", "train_input_fn")
FUNCTIONS = (
    "keras_model_fn",
    "estimator_fn",
    "model_fn",
    "train_input_fn",
    "eval_input_fn",
    "serving_input_fn",
)
_LOOPS_AND_BLOCKS = (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
    consts = {n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)}
    return "__name__" in names and "__main__" in consts


def _calls_own_function(node: ast.stmt, defined: set[str]) -> bool:
    """A top-level call of one of the module's functions (``main()``, ``train(args)``) or of
    something that trains (``model.fit(...)``, ``tf.estimator.train_and_evaluate(...)``)."""
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Name) and func.id in defined:
            return True
        if isinstance(func, ast.Attribute) and func.attr in (
            "fit",
            "train",
            "train_and_evaluate",
            "run",
        ):
            return True
    return False


def legacy_functions(source: str) -> list[str]:
    """The legacy-mode functions ``source`` defines when it has no code that runs them;
    [] for a script-mode script (or one that does not parse: Python will say why)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = [name for name in FUNCTIONS if name in defined]
    if not any(name in defined for name in MARKERS):
        return []
    for node in tree.body:
        if _is_main_guard(node) or isinstance(node, _LOOPS_AND_BLOCKS):
            return []
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) and _calls_own_function(
            node, defined
        ):
            return []
    return found


def check_bundle(bundle_path: str, entry_point: str) -> None:
    """Refuse a legacy-mode entry point inside the staged bundle (sourcedir.tar.gz)."""
    if not entry_point.endswith(".py"):
        return
    try:
        with tarfile.open(bundle_path, "r:*") as tar:
            member = tar.extractfile(entry_point.removeprefix("./"))
            source = member.read().decode("utf-8", "replace") if member else ""
    except (OSError, KeyError, tarfile.TarError):
        return
    found = legacy_functions(source)
    if found:
        raise ValidationError(
            f"entry_point {entry_point!r} is a TensorFlow legacy-mode script: it defines "
            f"{', '.join(found)} and no code that runs (no `if __name__ == '__main__':`). "
            "SageMaker's legacy mode, where the container called these functions (TF <= 1.11), "
            "is gone since SageMaker Python SDK v2: the script is run as a program, so this "
            "job would complete with an empty model. Add a main block that builds the model, "
            "trains it on os.environ['SM_CHANNEL_TRAINING'] and saves it under "
            "os.environ['SM_MODEL_DIR'] (SageMaker's 'migrate from legacy mode to script mode')."
        )
