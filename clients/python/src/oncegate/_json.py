"""JSON encoding without ``json.dumps``' per-call overhead, for the encoders called on every
guarded cycle (a receipt in :mod:`oncegate.models`, the params in :mod:`oncegate.fingerprints`).
No IO; imports nothing of the package."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["one_shot"]


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, without what ``JSONEncoder.iterencode`` redoes in Python on every call
    (a closure, an encoder object's arguments gathered one by one): the same C encoder with the
    same options, made per call with its own circular-reference markers. ``encoder.encode`` where
    the C encoder is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:
        return encoder.encode
    strings = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    options = (encoder.default, strings, None, encoder.key_separator, encoder.item_separator)
    flags = (encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return strings(value)  # type: ignore[no-any-return]
        markers = {} if encoder.check_circular else None
        return "".join(make(markers, *options, *flags)(value, 0))

    return encode
