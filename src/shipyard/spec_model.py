"""The models of shipyard.spec without pydantic: fields, pydantic's lax coercions, its errors.

Why: ``import pydantic`` and building spec's five models cost ~0.1 s of CPU in every
client process before a job is submitted, on the critical path of launching one (issue
40). The spec's field types are few (str, int, bool, Literal, optional, dict and list of
those, nested models), so they are read here as pydantic 2's lax (Python) mode reads
them, with its error wording, locations and order, and its JSON: the messages a user sees
and a stored spec's bytes stay what they were (tests/unit/test_spec_parity.py keeps the
pydantic models as the reference).

A ``Model`` lists its ``Field``s in order; each field is a chain of checks
(``before`` validators, the type's check, ``after`` validators) and the model runs its
``model_validators`` once every field is valid, as pydantic does.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from shipyard.errors import ValidationError

Loc = tuple[str | int, ...]
Errors = list[dict[str, Any]]
Check = Callable[[Any, Loc, Errors], Any]
M = TypeVar("M", bound="Model")


class _Bad:
    """The result of a check that recorded an error (never a valid value)."""

    def __repr__(self) -> str:
        return "<bad>"


BAD: Any = _Bad()
MISSING: Any = object()


class SpecValidationError(ValidationError):
    """A model's input refused, with pydantic's list of problems (``errors()``: dicts of
    ``loc``, ``msg``, ``type``), so a caller words them as it always did."""

    def __init__(self, title: str, errors: Errors) -> None:
        self._errors = errors
        where = lambda e: ".".join(str(p) for p in e["loc"]) or "job"  # noqa: E731
        super().__init__(
            f"invalid {title}: " + "; ".join(f"{where(e)}: {e['msg']}" for e in errors)
        )

    def errors(self) -> Errors:
        return list(self._errors)


def _error(errors: Errors, loc: Loc, kind: str, msg: str) -> Any:
    errors.append({"loc": loc, "msg": msg, "type": kind})
    return BAD


# -- the types' checks, as pydantic 2's lax mode reads a Python value ----------------------

_INT_TEXT = re.compile(r"[+-]?[0-9]+(_[0-9]+)*(\.0+)?")
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _decimal_or_fraction(value: Any) -> bool:
    """``value`` is a Decimal or Fraction (neither module is imported for the test: a value
    of one exists only once its module is)."""
    return any(
        (mod := sys.modules.get(name)) is not None and isinstance(value, getattr(mod, cls))
        for name, cls in (("decimal", "Decimal"), ("fractions", "Fraction"))
    )


def check_str(value: Any, loc: Loc, errors: Errors) -> Any:
    """str (a subclass read as its str), bytes decoded as UTF-8; nothing else."""
    if isinstance(value, str):
        return value if type(value) is str else str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return _error(
                errors,
                loc,
                "string_unicode",
                "Input should be a valid string, unable to parse raw data as a unicode string",
            )
    return _error(errors, loc, "string_type", "Input should be a valid string")


def check_int(value: Any, loc: Loc, errors: Errors) -> Any:
    """int; bool as 0/1; a whole finite float or Decimal; a string of a whole number
    (whitespace, sign, '_' between digits and a '.000' tail allowed); bytes as a string."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) or _decimal_or_fraction(value):
        try:
            whole = value == int(value)
        except (OverflowError, ValueError):  # inf, nan
            return _error(errors, loc, "finite_number", "Input should be a finite number")
        if not whole:
            return _error(
                errors,
                loc,
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
            )
        return int(value)
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            value = ""
    if isinstance(value, str):
        text = value.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".")[0])
        return _error(
            errors,
            loc,
            "int_parsing",
            "Input should be a valid integer, unable to parse string as an integer",
        )
    return _error(errors, loc, "int_type", "Input should be a valid integer")


def check_bool(value: Any, loc: Loc, errors: Errors) -> Any:
    """bool; 0/1 (int or float); the strings pydantic reads as one (yes/no, on/off, ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            value = "?"
    parsing = "Input should be a valid boolean, unable to interpret input"
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        return _error(errors, loc, "bool_parsing", parsing)
    if isinstance(value, int):
        if value in (0, 1):
            return value == 1
        return _error(errors, loc, "bool_parsing", parsing)
    if isinstance(value, float) and value in (0.0, 1.0):
        return value == 1.0
    return _error(errors, loc, "bool_type", "Input should be a valid boolean")


def literal_words(values: tuple[Any, ...]) -> str:
    """pydantic's list of a Literal's values: 'a', 'b' or 'c'."""
    words = [repr(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_literal(*values: str) -> Check:
    """One of ``values`` (strings, matched exactly)."""
    msg = "Input should be " + literal_words(values)

    def check(value: Any, loc: Loc, errors: Errors) -> Any:
        if isinstance(value, str) and value in values:
            return values[values.index(value)]
        return _error(errors, loc, "literal_error", msg)

    return check


def optional(check: Check) -> Check:
    """None, or what ``check`` accepts."""

    def check_optional(value: Any, loc: Loc, errors: Errors) -> Any:
        return None if value is None else check(value, loc, errors)

    return check_optional


def check_str_or_false(value: Any, loc: Loc, errors: Errors) -> Any:
    """``str | Literal[False]`` as pydantic's smart union reads it: a string (or bytes),
    else False (or a number equal to it); otherwise both branches' errors."""
    if value is False:
        return False
    if isinstance(value, (str, bytes, bytearray)):
        mine: Errors = []
        out = check_str(value, loc + ("str",), mine)
        if out is not BAD:
            return out
        errors.extend(mine)
    elif (isinstance(value, (int, float)) or _decimal_or_fraction(value)) and value == 0:
        return False
    else:
        check_str(value, loc + ("str",), errors)
    return _error(errors, loc + ("literal[False]",), "literal_error", "Input should be False")


def _items(value: Any) -> Iterator[Any] | None:
    """A list's items from what pydantic's lax mode takes as a list, else None."""
    if isinstance(value, (str, bytes, bytearray, Mapping)):
        return None
    if isinstance(value, (list, tuple, set, frozenset)) or hasattr(value, "__next__"):
        return iter(value)
    if type(value).__name__ in ("deque", "dict_keys", "dict_values"):
        return iter(value)
    return None


def list_of(check: Check) -> Check:
    """A list (or tuple, set, iterator) of what ``check`` accepts, each item's error at
    its index."""

    def check_list(value: Any, loc: Loc, errors: Errors) -> Any:
        items = _items(value)
        if items is None:
            return _error(errors, loc, "list_type", "Input should be a valid list")
        out, before = [], len(errors)
        for i, item in enumerate(items):
            out.append(check(item, loc + (i,), errors))
        return out if len(errors) == before else BAD

    return check_list


def dict_of(check: Check | None) -> Check:
    """A dict (or mapping) of str keys to what ``check`` accepts (anything where None);
    a key's error at ``(key, '[key]')``, a value's at ``(key,)``."""

    def check_dict(value: Any, loc: Loc, errors: Errors) -> Any:
        if not isinstance(value, Mapping):
            return _error(errors, loc, "dict_type", "Input should be a valid dictionary")
        out, before = {}, len(errors)
        for key, item in value.items():
            name = check_str(key, loc + (key, "[key]"), errors)
            item = item if check is None else check(item, loc + (key,), errors)
            out[name] = item
        return out if len(errors) == before else BAD

    return check_dict


def model(cls: type[Model]) -> Check:
    """An instance of ``cls`` (kept as it is) or a dict of its fields."""

    def check_model(value: Any, loc: Loc, errors: Errors) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            return _error(
                errors,
                loc,
                "model_type",
                f"Input should be a valid dictionary or instance of {cls.__name__}",
            )
        return cls._build(value, loc, errors)

    return check_model


# -- fields and models -----------------------------------------------------------------------


class Field:
    """One field: its type's check, a default (a value or a factory; none: required), and
    validators (``before`` on the raw input, ``after`` on the checked value) whose
    ValueError is pydantic's "Value error, ..."."""

    def __init__(
        self,
        check: Check,
        default: Any = MISSING,
        factory: Callable[[], Any] | None = None,
        before: tuple[Callable[[Any], Any], ...] = (),
        after: tuple[Callable[[Any], Any], ...] = (),
    ) -> None:
        self.check, self.default, self.factory = check, default, factory
        self.before, self.after = before, after

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.factory is None

    def read(self, value: Any, loc: Loc, errors: Errors) -> Any:
        try:
            for validator in self.before:
                value = validator(value)
        except ValueError as exc:
            return _error(errors, loc, "value_error", f"Value error, {exc}")
        value = self.check(value, loc, errors)
        if value is BAD:
            return BAD
        try:
            for validator in self.after:
                value = validator(value)
        except ValueError as exc:
            return _error(errors, loc, "value_error", f"Value error, {exc}")
        return value


# what a JSON input is called where pydantic reads JSON (model_validate_json)
_JSON_WORDS = {
    "model_type": "Input should be an object",
    "dict_type": "Input should be an object",
    "list_type": "Input should be a valid array",
}


class Model:
    """A validated record of ``fields`` (extra inputs refused), built as pydantic builds a
    model: every field checked in order, extra keys after them, then the model validators
    (names of methods returning the model) once all fields are valid."""

    fields: ClassVar[dict[str, Field]] = {}
    model_validators: ClassVar[tuple[str, ...]] = ()
    title: ClassVar[str] = ""

    def __init__(self, **data: Any) -> None:
        errors: Errors = []
        built = type(self)._build(data, (), errors, into=self)
        if built is BAD:
            raise SpecValidationError(self.title or type(self).__name__, errors)

    @classmethod
    def _build(cls, data: Mapping[str, Any], loc: Loc, errors: Errors, into: Any = None) -> Any:
        before = len(errors)
        values = {}
        for name, field in cls.fields.items():
            if name in data:
                values[name] = field.read(data[name], loc + (name,), errors)
            elif field.required:
                _error(errors, loc + (name,), "missing", "Field required")
            else:
                values[name] = field.factory() if field.factory else field.default
        for key in data:
            if key not in cls.fields:
                _error(errors, loc + (key,), "extra_forbidden", "Extra inputs are not permitted")
        if len(errors) > before:
            return BAD
        self = into if into is not None else cls.__new__(cls)
        self.__dict__.update(values)
        try:
            for name in cls.model_validators:
                self = getattr(self, name)()
        except ValueError as exc:
            return _error(errors, loc, "value_error", f"Value error, {exc}")
        return self

    # -- pydantic's API, as the callers use it ---------------------------------------------

    @classmethod
    def model_validate(cls: type[M], data: Any) -> M:
        """A model from a dict of its fields (or an instance, kept), or SpecValidationError."""
        errors: Errors = []
        built = model(cls)(data, (), errors)
        if built is BAD:
            raise SpecValidationError(cls.title or cls.__name__, errors)
        return built

    @classmethod
    def model_validate_json(cls: type[M], text: str | bytes) -> M:
        """A model from its JSON (``model_dump_json``), or SpecValidationError."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SpecValidationError(
                cls.title or cls.__name__,
                [{"loc": (), "msg": f"Invalid JSON: {exc}", "type": "json_invalid"}],
            ) from None
        try:
            return cls.model_validate(data)
        except SpecValidationError as exc:
            errors = [{**e, "msg": _JSON_WORDS.get(e["type"], e["msg"])} for e in exc.errors()]
            raise SpecValidationError(cls.title or cls.__name__, errors) from None

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict, nested models as dicts (``mode="json"``: as in the JSON)."""
        if mode == "json":
            return json.loads(self.model_dump_json())
        return {name: _dumped(getattr(self, name)) for name in self.fields}

    def model_dump_json(self, indent: int | None = None) -> str:
        """The JSON pydantic writes: fields in order, compact (or ``indent`` spaces)."""
        return _json(self, indent, 0)

    def model_copy(self: M, update: Mapping[str, Any] | None = None) -> M:
        """A shallow copy, ``update``'s fields set as given (not validated, as pydantic)."""
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(update or {})
        return copy

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    def __setattr__(self, name: str, value: Any) -> None:
        """A field may be set (unvalidated, as pydantic); any other name is refused."""
        if name not in self.fields:
            raise ValueError(f'"{type(self).__name__}" object has no field "{name}"')
        self.__dict__[name] = value

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.fields)
        return f"{type(self).__name__}({inner})"


def _dumped(value: Any) -> Any:
    if isinstance(value, Model):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _dumped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dumped(v) for v in value]
    return value


# -- pydantic's JSON ----------------------------------------------------------------------


def json_float(value: float) -> str:
    """A float as pydantic writes it: Python's shortest repr, but decimal down to 1e-5
    and the exponent unpadded (1e-7, 1e+16); inf and nan as null."""
    if not math.isfinite(value):
        return "null"
    text = repr(float(value))
    if "e" not in text:
        return text
    mantissa, exp = text.split("e")
    power = int(exp)
    if power == -5:
        sign = "-" if mantissa.startswith("-") else ""
        return f"{sign}0.0000{mantissa.lstrip('-').replace('.', '')}"
    return f"{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float):
        return repr(key)
    return str(key)


def _json(value: Any, indent: int | None, level: int) -> str:
    if isinstance(value, Model):
        value = {name: getattr(value, name) for name in value.fields}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        parts = [
            (json.dumps(_json_key(k), ensure_ascii=False), _json(v, indent, level + 1))
            for k, v in value.items()
        ]
        return _joined(
            [f"{k}{':' if indent is None else ': '}{v}" for k, v in parts], "{}", indent, level
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return _joined([_json(v, indent, level + 1) for v in value], "[]", indent, level)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _joined(parts: list[str], brackets: str, indent: int | None, level: int) -> str:
    if indent is None or not parts:
        return brackets[0] + ",".join(parts) + brackets[1]
    inner = "\n" + " " * (indent * (level + 1))
    return (
        brackets[0]
        + inner
        + ("," + inner).join(parts)
        + "\n"
        + " " * (indent * level)
        + brackets[1]
    )
