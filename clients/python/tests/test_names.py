"""The public names: one exception hierarchy with the ``Error`` suffix, and the old names as aliases,
listed once, in the README's table of deprecated names, which is checked against the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import oncegate
import oncegate.errors
import oncegate.errors.deprecated
from oncegate import (
    ActionRef,
    CompleteUnacknowledgedError,
    DefiniteFailureError,
    Grant,
    GuardOptions,
    OncegateError,
    OutcomeUnknownError,
    Scope,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def deprecated_table() -> dict[str, str]:
    """The README's table of deprecated names: the one list of them, old name to new."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Deprecated names\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", section, flags=re.MULTILINE)
    assert rows[0] == ("deprecated name", "use instead") and rows[1] == ("---", "---")
    return dict(rows[2:])


TABLE = deprecated_table()
ALIASES = {
    old.strip("`"): new.strip("`")
    for old, new in TABLE.items()
    if not old.startswith(("option ", "attribute "))
}
"""Each name before the Error suffix, and the class it now names."""


def test_the_readme_lists_exactly_the_aliases_the_code_defines() -> None:
    defined = {
        name: getattr(oncegate.errors.deprecated, name).__name__
        for name in oncegate.errors.deprecated.__all__
    }
    assert defined == ALIASES
    assert len(ALIASES) == 15
    # Any other class in oncegate.errors under a name not its own would be an alias left out.
    for module in (oncegate, oncegate.errors):
        renamed = {
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__name__ != name
        }
        assert renamed == set(ALIASES), module.__name__


def test_the_deprecated_option_is_in_the_table() -> None:
    assert TABLE["option `wait_timeout=`"].startswith("`max_wait=`")
    assert "wait_timeout" in inspect.signature(GuardOptions.__init__).parameters


def test_the_deprecated_attribute_is_in_the_table() -> None:
    assert TABLE["attribute `retry_after`"].startswith("`retry_after_ms`")
    assert isinstance(OncegateError.__dict__["retry_after"], property)
    assert "retry_after" in inspect.signature(OncegateError.__init__).parameters
    # The table lists exactly these two names that are not exception classes.
    assert sorted(old for old in TABLE if old.startswith(("option ", "attribute "))) == [
        "attribute `retry_after`",
        "option `wait_timeout=`",
    ]


# The classes added after the rename have no old name.
EXCEPTIONS = sorted(
    {
        *ALIASES.values(),
        "OncegateError",
        "TransportError",
        "ReceiptDecodeError",
        "PolicyDeniedError",
        "BudgetExceededError",
        "PendingApprovalError",
    }
)


@pytest.mark.parametrize(("old", "new"), sorted(ALIASES.items()))
def test_old_names_are_the_new_classes(old: str, new: str) -> None:
    cls = getattr(oncegate.errors, new)
    assert getattr(oncegate.errors, old) is cls and getattr(oncegate, old) is cls
    assert getattr(oncegate, new) is cls
    for module in (oncegate, oncegate.errors):
        assert old in module.__all__ and new in module.__all__


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_one_hierarchy_with_the_error_suffix(name: str) -> None:
    cls = getattr(oncegate, name)
    assert name.endswith("Error") and cls.__name__ == name
    assert issubclass(cls, OncegateError)


def test_the_exported_exceptions_are_exactly_these() -> None:
    exported = {
        name
        for name in oncegate.__all__
        if isinstance(getattr(oncegate, name), type) and issubclass(getattr(oncegate, name), BaseException)
    }
    # ParamsError and StatementError are the offline checks' (fingerprint, verify_grant), not the gate's.
    assert exported == set(EXCEPTIONS) | set(ALIASES) | {"ParamsError", "StatementError"}


def test_guard_exceptions_print_as_before() -> None:
    grant = Grant(token="tok", fencing=2, provider_key="og-1", lease_expires_at=None)
    action = ActionRef(Scope("agent", "run"), "pay:key")
    unknown = OutcomeUnknownError("the outcome is unknown", action=action, grant=grant)
    assert str(unknown) == "the outcome is unknown" and unknown.args == ("the outcome is unknown",)
    assert unknown.reason is None and unknown.code is None and not unknown.retryable
    assert (unknown.token, unknown.fencing, unknown.provider_key) == ("tok", 2, "og-1")
    unacknowledged = CompleteUnacknowledgedError(
        "not acknowledged", action=action, grant=grant, result={"ok": True}, receipt=b"{}"
    )
    assert isinstance(unacknowledged, OutcomeUnknownError) and str(unacknowledged) == "not acknowledged"
    for args in [(), ("declined",), ("declined", 402)]:
        definite = DefiniteFailureError(*args)
        assert str(definite) == str(Exception(*args)) and definite.args == args
        assert definite.reason is None and not definite.retryable


def test_a_subclass_of_the_marker_keeps_its_own_arguments() -> None:
    class Declined(DefiniteFailureError):
        def __init__(self, code: int) -> None:
            super().__init__(f"declined with {code}")
            self.code_from_provider = code

    declined = Declined(51)
    assert str(declined) == "declined with 51" and declined.code_from_provider == 51
    with pytest.raises(oncegate.DefiniteFailure):
        raise declined
