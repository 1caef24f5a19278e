"""The service models botocore ships as the server's contract: which operations exist and
what their input must look like.

Why botocore's models and not hand-written checks: they are what the real SDK and boto3
send requests from, and what AWS validates against, so the limits (a hyperparameter value
of at most 2,500 characters, at most 100 of them, 50 tags, a job name's pattern) cannot
drift from SageMaker's. botocore's own client validates only types, required members and
minimums; this checks everything the model states, as the service does, because the
server also meets hand-written requests (curl, other SDKs, an attacker).

``Contract.validate`` raises ``ValidationException`` (400) in AWS's wording, naming each
bad member by its path (``resourceConfig.instanceCount``, ``tags.1.member.key``,
``hyperParameters.lr``), never a 500 later. Patterns are Java regular expressions; the
few Python's ``re`` cannot read (``\\p{L}`` classes) are read by the ``regex`` module
when it is installed and otherwise left to the length limits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from shipyard.server.errors import ApiError

MAX_REPORTED = 10  # AWS lists every violation; a hostile request could have thousands
_ENUM_SHOWN = 20  # allowed values listed (instance types are hundreds)
_VALUE_SHOWN = 100  # characters of a bad value quoted in the message (a 3 MB one is cut)


def _model(service: str) -> Any:
    try:
        import botocore.session
    except ImportError:  # pragma: no cover - the server's extra installs boto3
        raise RuntimeError(
            "shipyard server needs botocore (its service models are the API contract): "
            "pip install 'shipyard[s3]'"
        ) from None
    return botocore.session.get_session().get_service_model(service)


# Java's POSIX classes are ASCII unless a pattern asks for Unicode: so read, ``re`` can
# compile the sagemaker-runtime header patterns (``\p{ASCII}*``, ``\A\S[\p{Print}]*\z``)
_JAVA_CLASSES = {r"\p{ASCII}": r"\x00-\x7f", r"\p{Print}": r"\x20-\x7e"}
_CHAR_CLASS = re.compile(r"\[(?:\\.|[^\]\\])*\]")


def _java(source: str) -> str:
    r"""A Java pattern's ASCII classes and ``\z`` in Python's spelling."""

    def inside(match: re.Match[str]) -> str:
        text = match[0]
        for java, span in _JAVA_CLASSES.items():
            text = text.replace(java, span)
        return text

    out = _CHAR_CLASS.sub(inside, source)
    for java, span in _JAVA_CLASSES.items():
        out = out.replace(java, f"[{span}]")
    return out.replace(r"\z", r"\Z")


@functools.cache
def _pattern(source: str) -> Any:
    """``source`` compiled (None: neither ``re`` nor ``regex`` reads it)."""
    try:
        return re.compile(_java(source))
    except re.error:
        pass
    try:
        import regex
    except ImportError:
        return None
    try:
        return regex.compile(source)
    except regex.error:
        return None


def _camel(name: str) -> str:
    """AWS names members in messages lowerCamelCase (``resourceConfig.instanceCount``)."""
    return name[:1].lower() + name[1:]


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= _VALUE_SHOWN else text[:_VALUE_SHOWN] + "...(truncated)"


class Contract:
    """One service's model: ``operations`` are the names implemented here (the rest are
    unknown actions, whatever the model also holds)."""

    def __init__(
        self,
        service: str,
        operations: set[str] | frozenset[str],
        error_code: str = "ValidationException",
    ) -> None:
        self.service = service
        self.error_code = error_code  # sagemaker-runtime's model calls it ValidationError
        self.model = _model(service)
        missing = sorted(set(operations) - set(self.model.operation_names))
        if missing:  # a table out of step with botocore: fail at start, not per request
            raise RuntimeError(f"{service} operations not in botocore's model: {missing}")
        self.operations = frozenset(operations)

    def validate(self, operation: str, params: Any) -> None:
        """Raise ValidationException listing what in ``params`` breaks the input shape."""
        shape = self.model.operation_model(operation).input_shape
        errors: list[str] = []
        if shape is not None:
            self._check(shape, params, "", errors)
        if errors:
            count = len(errors)
            noun = "error" if count == 1 else "errors"
            shown = "; ".join(errors[:MAX_REPORTED])
            more = f"; and {count - MAX_REPORTED} more" if count > MAX_REPORTED else ""
            raise ApiError(self.error_code, f"{count} validation {noun} detected: {shown}{more}")

    def known(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` without the members the operation's input shape does not have, at
        any depth: what the handler sees. AWS's JSON services ignore members they do not
        model (botocore refuses them client-side, "Unknown parameter in input"), so a
        hand-written request's extra key is dropped, never stored or echoed back."""
        shape = self.model.operation_model(operation).input_shape
        return self._prune(shape, params) if shape is not None else {}

    def _prune(self, shape: Any, value: Any) -> Any:
        kind = shape.type_name
        if kind == "structure" and isinstance(value, dict):
            return {
                name: self._prune(shape.members[name], item)
                for name, item in value.items()
                if name in shape.members
            }
        if kind == "list" and isinstance(value, list):
            return [self._prune(shape.member, item) for item in value]
        if kind == "map" and isinstance(value, dict):
            return {key: self._prune(shape.value, item) for key, item in value.items()}
        return value

    def rest_input(
        self, operation: str, headers: Mapping[str, str], uri: Mapping[str, str]
    ) -> dict[str, str]:
        """A REST operation's input members that travel in headers and in the path, by
        member name, as the model places them: what :meth:`validate` then checks (the
        payload is the caller's, with its own limit)."""
        params: dict[str, str] = {}
        for name, member in self.model.operation_model(operation).input_shape.members.items():
            where = member.serialization.get("location")
            wire = member.serialization.get("name", name)
            if where == "header" and wire.lower() in headers:
                params[name] = headers[wire.lower()]
            elif where == "uri" and wire in uri:
                params[name] = uri[wire]
            elif where is None and member.type_name == "blob":
                params[name] = ""  # the payload: present, its size the caller's to check
        return params

    # -- one shape -------------------------------------------------------------------------
    def _check(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if len(errors) > MAX_REPORTED:
            return
        kind = shape.type_name
        check = getattr(self, f"_{kind}", None)
        if check is not None:
            check(shape, value, path, errors)

    @staticmethod
    def _fail(errors: list[str], value: Any, path: str, constraint: str) -> None:
        where = path or "request"
        errors.append(
            f"Value '{_shown(value)}' at '{where}' failed to satisfy constraint: {constraint}"
        )

    def _structure(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            self._fail(errors, value, path, "Member must be an object (a JSON structure)")
            return
        for name in shape.required_members:
            if value.get(name) is None:
                where = f"{path}.{_camel(name)}" if path else _camel(name)
                errors.append(
                    f"Value null at '{where}' failed to satisfy constraint: Member must not be null"
                )
        for name, member in shape.members.items():
            if name in value and value[name] is not None:
                where = f"{path}.{_camel(name)}" if path else _camel(name)
                self._check(member, value[name], where, errors)

    def _list(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, list):
            self._fail(errors, value, path, "Member must be a list")
            return
        self._size(shape, value, path, errors, "Member must have length")
        for index, item in enumerate(value, 1):
            self._check(shape.member, item, f"{path}.{index}.member", errors)

    def _map(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            self._fail(errors, value, path, "Member must be a map (a JSON object)")
            return
        self._size(shape, value, path, errors, "Map must have number of entries")
        for key, item in value.items():
            self._check(shape.key, key, f"{path}.key", errors)
            self._check(shape.value, item, f"{path}.{key}", errors)

    def _string(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, str):
            self._fail(errors, value, path, "Member must be a string")
            return
        self._size(shape, value, path, errors, "Member must have length")
        enum = shape.enum
        if enum and value not in enum:
            listed = ", ".join(enum[:_ENUM_SHOWN])
            if len(enum) > _ENUM_SHOWN:
                listed += f", ... ({len(enum)} values in all: see the API reference)"
            self._fail(errors, value, path, f"Member must satisfy enum value set: [{listed}]")
            return
        source = shape.metadata.get("pattern")
        if source:
            compiled = _pattern(source)
            if compiled is not None and compiled.fullmatch(value) is None:
                self._fail(
                    errors,
                    value,
                    path,
                    f"Member must satisfy regular expression pattern: {source}",
                )

    def _integer(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(errors, value, path, "Member must be an integer")
            return
        self._range(shape, value, path, errors)

    _long = _integer

    def _double(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._fail(errors, value, path, "Member must be a number")
            return
        self._range(shape, value, path, errors)

    _float = _double

    def _boolean(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, bool):
            self._fail(errors, value, path, "Member must be true or false")

    def _timestamp(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        # the JSON protocols send epoch seconds; an ISO 8601 string is read by the handler
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            self._fail(errors, value, path, "Member must be a timestamp (epoch seconds)")

    def _blob(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, str):
            self._fail(errors, value, path, "Member must be base64-encoded data (a string)")

    def _size(self, shape: Any, value: Any, path: str, errors: list[str], what: str) -> None:
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if low is not None and len(value) < low:
            self._fail(errors, value, path, f"{what} greater than or equal to {low}")
        elif high is not None and len(value) > high:
            self._fail(errors, value, path, f"{what} less than or equal to {high}")

    def _range(self, shape: Any, value: Any, path: str, errors: list[str]) -> None:
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if low is not None and value < low:
            self._fail(
                errors, value, path, f"Member must have value greater than or equal to {low}"
            )
        elif high is not None and value > high:
            self._fail(errors, value, path, f"Member must have value less than or equal to {high}")


def unknown_operation(service: str, operation: str) -> ApiError:
    """What AWS's JSON services answer for an action they do not have."""
    return ApiError(
        "UnknownOperationException",
        f"{service} operation {operation!r} is not served by shipyard server",
    )
