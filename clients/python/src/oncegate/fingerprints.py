"""Computes oncegate fingerprints offline, exactly as the gate does.

A fingerprint is ``v1-`` followed by the lowercase hex SHA-256 of the RFC 8785 (JCS) canonical
form of ``{"action": action, "intent": intent or null, "params": <key fields of params>}``.

Params are parsed as strictly as the server parses them: duplicate member names, integers whose
magnitude exceeds 2**53 and other numbers that reach it (JCS would round them into another
action's fingerprint), nesting deeper than 32 levels, lone surrogates and non-standard literals
(``NaN``, ``Infinity``) are refused. So is a number literal whose decimal value is not the one
JCS would write for it (``0.100000000000000001`` would be written ``0.1``, ``1e-400`` would be
written ``0``): two different amounts must never share a fingerprint. The parser reports the
first problem in the order the server meets them, so both sides name the same error for the same
text.

Python values: a ``float`` is a double already and is sent in its shortest form, so it is always
accepted (``0.1`` stays ``0.1``; a float that was rounded before it reached the client cannot be
told apart). A :class:`decimal.Decimal` is sent as the double it equals, and refused with
``inexact_number`` when it has no such double (``Decimal("0.100000000000000001")``), exactly as
the same text is refused by the gate.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Final, Literal

import rfc8785

from oncegate._json import one_shot

__all__ = [
    "MAX_DEPTH",
    "MAX_PARAMS_BYTES",
    "MAX_SAFE_NUMBER",
    "VERSION_TAG",
    "ParamsError",
    "ParamsErrorKind",
    "canonical_form",
    "encode_params",
    "fingerprint",
    "parse_params",
    "resolve_pointer",
    "select_key_fields",
]

VERSION_TAG: Final = "v1"
"""The version tag of the canonical form; a new canonical form gets a new tag."""

MAX_SAFE_NUMBER: Final = 2**53
"""Largest accepted magnitude of an integer literal: beyond it a double no longer holds every
integer. A number written with a fraction or an exponent must stay *below* it, since from 2**53 on
the literal may have been rounded (``9007199254740993.0`` parses to 2**53)."""

MAX_DEPTH: Final = 32
"""Deepest accepted nesting of objects and arrays; the top-level object is depth 1."""

MAX_PARAMS_BYTES: Final = 64 * 1024
"""Largest accepted params text, in UTF-8 bytes."""

ParamsErrorKind = Literal[
    "duplicate_member",
    "unsafe_number",
    "inexact_number",
    "not_an_object",
    "syntax",
    "too_deep",
    "too_large",
]


class ParamsError(ValueError):
    """Params the gate would refuse with ``INVALID_REQUEST``.

    ``kind`` names the problem with the same words as the shared fingerprint vectors.
    """

    def __init__(self, kind: ParamsErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ParamsErrorKind = kind


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
_LITERALS: Final[tuple[tuple[str, Any], ...]] = (("true", True), ("false", False), ("null", None))
_SAFE_INT_DIGITS: Final = len(str(MAX_SAFE_NUMBER))


class _Parser:
    """A recursive-descent JSON parser that checks the server's rules as it goes.

    The standard ``json`` module would accept ``NaN`` and lone surrogates, and would notice a
    duplicate member only when its object closes; walking the text by hand keeps the errors in
    the order the server meets them.
    """

    def __init__(self, text: str, max_depth: int) -> None:
        self.text = text
        self.pos = 0
        self.max_depth = max_depth
        self.path: list[str] = []
        # The first number literal JCS would change, found while parsing and reported once the
        # parse succeeded (the server checks literals after its parse, so its parse errors win).
        self.inexact: ParamsError | None = None

    def document(self) -> Any:
        self._skip_whitespace()
        value = self._value(0)
        self._skip_whitespace()
        if self.pos != len(self.text):
            raise self._syntax("trailing characters")
        return value

    def _syntax(self, what: str) -> ParamsError:
        return ParamsError("syntax", f"params are not valid JSON: {what} at offset {self.pos}")

    def _skip_whitespace(self) -> None:
        self.pos = _WHITESPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _value(self, depth: int) -> Any:
        char = self._peek()
        if char == "{":
            return self._object(depth)
        if char == "[":
            return self._array(depth)
        if char == '"':
            return self._string()
        if char and char in "-0123456789":
            return self._number()
        for literal, value in _LITERALS:
            if self.text.startswith(literal, self.pos):
                self.pos += len(literal)
                return value
        raise self._syntax("expected a value" if char else "unexpected end of input")

    def _enter(self, depth: int) -> None:
        if depth + 1 > self.max_depth:
            raise ParamsError("too_deep", f"params nest deeper than {self.max_depth} levels")

    def _object(self, depth: int) -> dict[str, Any]:
        self._enter(depth)
        self.pos += 1
        members: dict[str, Any] = {}
        self._skip_whitespace()
        if self._peek() == "}":
            self.pos += 1
            return members
        while True:
            if self._peek() != '"':
                raise self._syntax("expected a member name")
            name = self._string()
            if name in members:
                raise ParamsError("duplicate_member", f"params repeat the member name {name!r}")
            self._skip_whitespace()
            if self._peek() != ":":
                raise self._syntax("expected ':'")
            self.pos += 1
            self._skip_whitespace()
            self.path.append(name.replace("~", "~0").replace("/", "~1"))
            members[name] = self._value(depth + 1)
            self.path.pop()
            self._skip_whitespace()
            char = self._peek()
            self.pos += 1
            if char == "}":
                return members
            if char != ",":
                raise self._syntax("expected ',' or '}'")
            self._skip_whitespace()

    def _array(self, depth: int) -> list[Any]:
        self._enter(depth)
        self.pos += 1
        items: list[Any] = []
        self._skip_whitespace()
        if self._peek() == "]":
            self.pos += 1
            return items
        while True:
            self.path.append(str(len(items)))
            items.append(self._value(depth + 1))
            self.path.pop()
            self._skip_whitespace()
            char = self._peek()
            self.pos += 1
            if char == "]":
                return items
            if char != ",":
                raise self._syntax("expected ',' or ']'")
            self._skip_whitespace()

    def _string(self) -> str:
        value: str
        try:
            value, self.pos = scanstring(self.text, self.pos + 1, True)
        except json.JSONDecodeError as err:
            raise ParamsError("syntax", f"params are not valid JSON: {err.msg} at offset {err.pos}") from None
        if _SURROGATE.search(value):
            raise self._syntax("lone UTF-16 surrogate in a string")
        return value

    def _number(self) -> int | float:
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise self._syntax("invalid number")
        literal = match.group(0)
        self.pos = match.end()
        if match.group(1) is None and match.group(2) is None:
            # An integer literal: compare exactly, a double would round 2**53 + 1 down to 2**53.
            if len(literal.lstrip("-")) > _SAFE_INT_DIGITS:
                raise _unsafe_number(literal)
            integer = int(literal)
            if abs(integer) > MAX_SAFE_NUMBER:
                raise _unsafe_number(literal)
            return integer
        number = float(literal)
        if math.isinf(number) or abs(number) >= MAX_SAFE_NUMBER:
            raise _unsafe_number(literal)
        # repr is the form JCS writes (shortest; of two shortest forms, the even one).
        if self.inexact is None and Decimal(literal) != Decimal(repr(number)):
            self.inexact = _inexact_number(literal, "/" + "/".join(self.path), number)
        return number


def _unsafe_number(literal: str) -> ParamsError:
    return ParamsError(
        "unsafe_number",
        f"params hold the number {literal[:40]}, beyond 2^53 in magnitude, "
        "which JSON doubles cannot represent exactly",
    )


def _inexact_number(literal: str, pointer: str, number: float) -> ParamsError:
    return ParamsError(
        "inexact_number",
        f"params hold the number {literal[:40]} at {pointer}, which a double cannot hold: it "
        f"would be read as {number!r}; send it as a string, or rounded to what a double holds",
    )


def parse_params(
    text: str, *, max_bytes: int = MAX_PARAMS_BYTES, max_depth: int = MAX_DEPTH
) -> dict[str, Any]:
    """Parses params text into a dict, refusing what the gate refuses.

    Raises:
        ParamsError: with ``kind`` ``too_large``, ``syntax``, ``duplicate_member``,
            ``unsafe_number``, ``too_deep`` or ``not_an_object``.
    """
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ParamsError("syntax", "params are not valid UTF-8 (lone surrogate)") from None
    if size > max_bytes:
        raise ParamsError("too_large", f"params are {size} bytes, more than the limit of {max_bytes}")
    parser = _Parser(text, max_depth)
    value = parser.document()
    if not isinstance(value, dict):
        raise ParamsError("not_an_object", "params must be a JSON object")
    if parser.inexact is not None:
        raise parser.inexact
    return value


def encode_params(params: Mapping[str, Any]) -> str:
    """Serialises a params mapping as compact JSON text, the form the client sends.

    A ``Decimal`` is sent as the double it equals (see the module docs).

    Raises:
        ParamsError: ``unsafe_number`` for NaN or infinite numbers, ``inexact_number`` for a
            ``Decimal`` that no double equals.
        TypeError: for values JSON cannot hold.
    """
    try:
        return _encode_params(params if type(params) is dict else dict(params))
    except ParamsError as err:
        if err.kind == "inexact_number":
            raise _inexact_decimal(params) or err from None
        raise
    except ValueError as err:
        raise ParamsError("unsafe_number", f"params hold a number JSON cannot carry: {err}") from None


def _inexact_decimal(value: Any, pointer: str = "") -> ParamsError | None:
    """The refusal of the first ``Decimal`` no double equals, named by its JSON Pointer (the
    encoder's hook sees the value, not where it is; this walk runs only on that error path)."""
    if isinstance(value, Decimal):
        try:
            _double(value, pointer or "/")
        except ParamsError as err:
            return err
        return None
    if isinstance(value, Mapping):
        members = ((str(name), member) for name, member in value.items())
    elif isinstance(value, (list, tuple)):
        members = ((str(index), item) for index, item in enumerate(value))
    else:
        return None
    for name, member in members:
        escaped = name.replace("~", "~0").replace("/", "~1")
        found = _inexact_decimal(member, f"{pointer}/{escaped}")
        if found is not None:
            return found
    return None


def _decimal_as_double(value: Any) -> Any:
    if not isinstance(value, Decimal):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return _double(value, "(a Decimal param)")


def _double(value: Decimal, pointer: str) -> float:
    """The double ``value`` equals; ``inexact_number`` (naming ``pointer``) when none does."""
    number = float(value)
    if math.isfinite(number) and Decimal(repr(number)) != value:
        raise _inexact_number(str(value), pointer, number)
    return number


def resolve_pointer(document: Any, pointer: str) -> tuple[bool, Any]:
    """Looks up an RFC 6901 JSON Pointer; returns ``(found, value)``.

    Follows the server's rules: ``""`` is the whole document, a pointer that does not start with
    ``/`` finds nothing, ``~1`` decodes to ``/`` and ``~0`` to ``~``, and array indexes are decimal
    without leading zeros (``-`` finds nothing).
    """
    if pointer == "":
        return True, document
    if not pointer.startswith("/"):
        return False, None
    target = document
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict):
            if token not in target:
                return False, None
            target = target[token]
        elif isinstance(target, list):
            if not _ARRAY_INDEX.fullmatch(token) or int(token) >= len(target):
                return False, None
            target = target[int(token)]
        else:
            return False, None
    return True, target


def select_key_fields(params: Mapping[str, Any], key_fields: Sequence[str] | None) -> Any:
    """The ``params`` member of the canonical form.

    With ``key_fields=None`` every param counts and the whole params object is used. Otherwise it
    is an object from each JSON Pointer to the value it finds, or ``null`` when absent.
    """
    if key_fields is None:
        return dict(params)
    return {pointer: resolve_pointer(params, pointer)[1] for pointer in key_fields}


def _as_doubles(value: Any) -> Any:
    """Turns integers into floats: JCS numbers are doubles, and the server formats them as such."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {name: _as_doubles(member) for name, member in value.items()}
    return [_as_doubles(item) for item in value]


def _parsed(params: Mapping[str, Any] | str) -> dict[str, Any]:
    text = params if isinstance(params, str) else encode_params(params)
    return parse_params(text)


def canonical_form(
    action: str,
    params: Mapping[str, Any] | str,
    intent: str | None = None,
    key_fields: Sequence[str] | None = None,
) -> str:
    """The RFC 8785 canonical JSON that the fingerprint hashes.

    Args:
        action: The action type, e.g. ``"payments.transfer"``.
        params: A mapping, or the params JSON text exactly as sent to the gate.
        intent: The intent id; ``None`` and ``""`` both mean no intent.
        key_fields: The action policy's key-field JSON Pointers, or ``None`` when every param
            counts (no policy names key fields).

    Raises:
        ParamsError: when the gate would refuse the params.
    """
    document = {
        "action": action,
        "intent": intent or None,
        "params": select_key_fields(_parsed(params), key_fields),
    }
    return rfc8785.dumps(_as_doubles(document)).decode("utf-8")


def fingerprint(
    action: str,
    params: Mapping[str, Any] | str,
    intent: str | None = None,
    key_fields: Sequence[str] | None = None,
) -> str:
    """The gate's fingerprint of a request: ``v1-`` plus the hex SHA-256 of its canonical form.

    Pass the policy's ``key_fields`` to reproduce the fingerprint of an action that has a policy;
    see :func:`canonical_form` for the arguments.

    >>> fingerprint("pay", {"amount": 5}, key_fields=["/amount", "/to/iban"])[:11]
    'v1-0c3f6954'
    """
    canonical = canonical_form(action, params, intent, key_fields)
    return f"{VERSION_TAG}-{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"


# One encoder for every call (json.dumps with options builds a new one each time).
_encode_params = one_shot(
    json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_decimal_as_double)
)
