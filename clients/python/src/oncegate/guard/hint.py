"""The ``key_fields_hint`` check: warn when the gate fingerprints a request differently than the
key fields the caller expects would.

It only logs: the gate's fingerprint is the one that counts, and nothing here changes an attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from oncegate.fingerprints import ParamsError, fingerprint
from oncegate.guard.options import Request

__all__ = ["check_key_fields_hint"]

logger = logging.getLogger("oncegate")


def check_key_fields_hint(request: Request, key_fields_hint: Sequence[str], server_fingerprint: str) -> None:
    """Logs a warning when ``key_fields_hint`` gives ``request`` another fingerprint than the gate's
    (the gate's policy for the action differs from the hint)."""
    try:
        local = fingerprint(request.action, request.params, request.intent_id, key_fields_hint)
    except ParamsError as err:
        local = f"(not computable: {err})"
    if local != server_fingerprint:
        logger.warning(
            "oncegate: the gate fingerprinted %s as %s, but key_fields_hint %s gives %s; the "
            "gate's policy for this action differs from the hint",
            request.action,
            server_fingerprint,
            list(key_fields_hint),
            local,
        )
