#!/usr/bin/env python3
"""Writes ``fingerprints.json``, the fingerprint vectors that the Rust and Python tests both check.

Run it after changing a case or the canonical form::

    python tests/vectors/generate.py

Every case is computed with the Python client's ``oncegate.fingerprints`` (installed, or from
``clients/python/src``). Cases with a hand-written ``expect`` canonical form are checked against it
first, so the vectors do not merely echo the implementation. Cases whose names start with
``eq:<group> /`` must share one fingerprint with the rest of their group; the script refuses to
write a file where they do not, and the Python tests check it again.

File format (read by the Rust tests, keep it stable)::

    {"version": 1, "cases": [
      {"name", "action", "params_json", "intent", "key_fields", "canonical", "fingerprint"},
      {"name", "action", "params_json", "intent", "key_fields", "error"}
    ]}

``error`` is one of ``duplicate_member``, ``unsafe_number``, ``inexact_number``,
``not_an_object``, ``syntax`` and ``too_deep``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "fingerprints.json"

try:
    from oncegate.fingerprints import ParamsError, canonical_form, fingerprint
except ImportError:
    sys.path.insert(0, str(HERE.parent.parent / "clients" / "python" / "src"))
    from oncegate.fingerprints import ParamsError, canonical_form, fingerprint

TRANSFER_KEYS = ["/amount", "/currency", "/to"]
"""The key fields of the example ``payments.transfer`` policy (the memo is not one)."""

CASES: list[dict[str, Any]] = []


def case(
    name: str,
    params_json: str,
    *,
    action: str = "pay",
    intent: str | None = None,
    key_fields: list[str] | None = None,
    expect: str | None = None,
    error: str | None = None,
) -> None:
    """Adds one accepted case (optionally with its expected canonical form) or one rejected case."""
    entry: dict[str, Any] = {
        "name": name,
        "action": action,
        "params_json": params_json,
        "intent": intent,
        "key_fields": key_fields,
    }
    if error is not None:
        try:
            canonical_form(action, params_json, intent, key_fields)
        except ParamsError as err:
            if err.kind != error:
                raise SystemExit(f"{name}: expected {error}, got {err.kind}: {err}") from None
        else:
            raise SystemExit(f"{name}: expected {error}, but the params were accepted")
        entry["error"] = error
    else:
        canonical = canonical_form(action, params_json, intent, key_fields)
        if expect is not None and canonical != expect:
            raise SystemExit(f"{name}: canonical form\n  {canonical}\nis not the expected\n  {expect}")
        entry["canonical"] = canonical
        entry["fingerprint"] = fingerprint(action, params_json, intent, key_fields)
    CASES.append(entry)


def nested(depth: int, innermost: str, open_: str = '{"a":', close: str = "}") -> str:
    """``depth`` nested containers around ``innermost``."""
    return open_ * depth + innermost + close * depth


def build() -> None:
    """Declares every case."""
    basic = '{"action":"pay","intent":null,"params":{"amount":100,"currency":"EUR","to":"DE89"}}'
    case("eq:basic / compact", '{"amount":100,"currency":"EUR","to":"DE89"}', expect=basic)
    case("eq:basic / members reordered", '{"to":"DE89","currency":"EUR","amount":100}', expect=basic)
    case(
        "eq:basic / whitespace everywhere",
        '\n { "currency" : "EUR" ,\t"amount"\r\n:\n100 , "to":"DE89" }\n\t',
        expect=basic,
    )
    case("eq:basic / 100.0", '{"amount":100.0,"currency":"EUR","to":"DE89"}', expect=basic)
    case("eq:basic / 1e2", '{"amount":1e2,"currency":"EUR","to":"DE89"}', expect=basic)
    case("eq:basic / 1E+2", '{"amount":1E+2,"currency":"EUR","to":"DE89"}', expect=basic)
    case("eq:basic / 10000e-2", '{"amount":10000e-2,"currency":"EUR","to":"DE89"}', expect=basic)
    case("eq:basic / 0.1e3", '{"amount":0.1e3,"currency":"EUR","to":"DE89"}', expect=basic)
    case(
        "eq:basic / escaped names and values",
        '{"\\u0061mount":100,"currency":"\\u0045UR","\\u0074\\u006F":"DE89"}',
        expect=basic,
    )
    case(
        "eq:basic / empty intent is no intent",
        '{"amount":100,"currency":"EUR","to":"DE89"}',
        intent="",
        expect=basic,
    )
    case("basic with amount 101", '{"amount":101,"currency":"EUR","to":"DE89"}')
    case("basic with currency USD", '{"amount":100,"currency":"USD","to":"DE89"}')
    case(
        "basic with an intent",
        '{"amount":100,"currency":"EUR","to":"DE89"}',
        intent="invoice-42#2",
        expect='{"action":"pay","intent":"invoice-42#2","params":{"amount":100,"currency":"EUR","to":"DE89"}}',
    )
    case("basic with a non-ASCII intent", '{"amount":100,"currency":"EUR","to":"DE89"}', intent="намерение-1")
    case("basic as a refund", '{"amount":100,"currency":"EUR","to":"DE89"}', action="refund")

    one = '{"action":"pay","intent":null,"params":{"n":1}}'
    for spelling in ("1", "1.0", "1e0", "10e-1", "0.1E1", "1.00000"):
        case(f"eq:one / {spelling}", f'{{"n":{spelling}}}', expect=one)

    zero = '{"action":"pay","intent":null,"params":{"n":0}}'
    for spelling in ("0", "-0", "0.0", "-0.0", "0e10", "-0E-3"):
        case(f"eq:zero / {spelling}", f'{{"n":{spelling}}}', expect=zero)

    case(
        "2^53 as an integer literal is accepted",
        '{"n":9007199254740992}',
        expect='{"action":"pay","intent":null,"params":{"n":9007199254740992}}',
    )
    case(
        "-2^53 as an integer literal is accepted",
        '{"n":-9007199254740992}',
        expect='{"action":"pay","intent":null,"params":{"n":-9007199254740992}}',
    )
    below = '{"action":"pay","intent":null,"params":{"n":9007199254740991}}'
    for spelling in ("9007199254740991", "9007199254740991.0", "9.007199254740991e15", "9007199254740991E0"):
        case(f"eq:2^53-1 / {spelling}", f'{{"n":{spelling}}}', expect=below)

    micro = '{"action":"pay","intent":null,"params":{"n":0.000001}}'
    for spelling in ("0.000001", "1e-6", "1E-06", "0.0000010"):
        case(f"eq:micro / {spelling}", f'{{"n":{spelling}}}', expect=micro)

    for literal, text in (
        ("1E-7", "1e-7"),
        ("1.5e-7", "1.5e-7"),
        ("0.00001", "0.00001"),
        ("4.50", "4.5"),
        ("0.002", "0.002"),
        ("-1.5", "-1.5"),
        ("333333333.3333333", "333333333.3333333"),
        ("0.1", "0.1"),
        ("100.00000000000001", "100.00000000000001"),
        ("579460800786596.2", "579460800786596.2"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("123456789.125", "123456789.125"),
        ("1e15", "1000000000000000"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e-300", "1.7976931348623157e-300"),
    ):
        case(
            f"number {literal}",
            f'{{"n":{literal}}}',
            expect=f'{{"action":"pay","intent":null,"params":{{"n":{text}}}}}',
        )

    case(
        "rust example: arrays, negative zero, non-ASCII",
        '{"b":[1,2.5,-0],"a":"é"}',
        expect='{"action":"pay","intent":null,"params":{"a":"é","b":[1,2.5,0]}}',
    )
    e_acute = '{"action":"pay","intent":null,"params":{"name":"José"}}'
    case("eq:e-acute / raw", '{"name":"José"}', expect=e_acute)
    case("eq:e-acute / escaped", '{"name":"Jos\\u00e9"}', expect=e_acute)
    case("eq:e-acute / escaped upper hex", '{"name":"Jos\\u00E9"}', expect=e_acute)
    emoji = '{"action":"pay","intent":null,"params":{"memo":"paid 😀"}}'
    case("eq:emoji / raw", '{"memo":"paid 😀"}', expect=emoji)
    case("eq:emoji / escaped surrogate pair", '{"memo":"paid \\ud83d\\ude00"}', expect=emoji)
    case("eq:emoji / escaped upper hex", '{"memo":"paid \\uD83D\\uDE00"}', expect=emoji)
    utf16 = '{"action":"pay","intent":null,"params":{"😀":"emoji","דּ":"dalet"}}'
    case(
        "eq:utf16-order / code-point order in the input",
        '{"\\ufb33":"dalet","\\ud83d\\ude00":"emoji"}',
        expect=utf16,
    )
    case("eq:utf16-order / UTF-16 order in the input", '{"😀":"emoji","דּ":"dalet"}', expect=utf16)
    case(
        "RFC 8785 member sorting example",
        '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh",'
        '"1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control",'
        '"\\u00f6":"Latin Small Letter O With Diaeresis"}',
        expect='{"action":"pay","intent":null,"params":{"\\r":"Carriage Return","1":"One",'
        '"\u0080":"Control","ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign",'
        '"😀":"Emoji: Grinning Face","דּ":"Hebrew Letter Dalet With Dagesh"}}',
    )
    case(
        "string escapes and control characters",
        '{"s":"q\\" b\\\\ s\\/ t\\t n\\n r\\r b\\b f\\f '
        'nul\\u0000 us\\u001f del\\u007f ls\\u2028 nbsp\\u00a0"}',
        expect='{"action":"pay","intent":null,"params":{"s":"q\\" b\\\\ s/ t\\t n\\n r\\r b\\b f\\f '
        'nul\\u0000 us\\u001f del\u007f ls\u2028 nbsp\u00a0"}}',
    )
    case(
        "member names with control characters sort by code unit",
        '{"\\n":"newline","\\u0001":"soh"," ":"space","":"empty"}',
        expect='{"action":"pay","intent":null,'
        '"params":{"":"empty","\\u0001":"soh","\\n":"newline"," ":"space"}}',
    )
    case("empty params", "{}", expect='{"action":"pay","intent":null,"params":{}}')
    case("empty params with whitespace inside", "{ \n }", expect='{"action":"pay","intent":null,"params":{}}')
    case(
        "non-ASCII action with quotes",
        '{"x":true}',
        action='платёж."отправить"',
        expect='{"action":"платёж.\\"отправить\\"","intent":null,"params":{"x":true}}',
    )
    order = (
        '{"action":"pay","intent":null,"params":{"flags":[true,false,null],"note":"",'
        '"order":{"items":[{"qty":2,"sku":"A"},{"qty":1,"sku":"B"}],'
        '"ship":{"to":{"city":"Berlin","zip":"10115"}}}}}'
    )
    case(
        "eq:nested / as written",
        '{"order":{"items":[{"sku":"A","qty":2},{"qty":1,"sku":"B"}],'
        '"ship":{"to":{"zip":"10115","city":"Berlin"}}},"flags":[true,false,null],"note":""}',
        expect=order,
    )
    case(
        "eq:nested / reordered at every level",
        '{"note":"","flags":[true,false,null],"order":{"ship":{"to":{"city":"Berlin","zip":"10115"}},'
        '"items":[{"qty":2.0,"sku":"A"},{"sku":"B","qty":1e0}]}}',
        expect=order,
    )
    case(
        "nested arrays keep their order",
        '{"m":[[2,1],[],[[3]],{}]}',
        expect='{"action":"pay","intent":null,"params":{"m":[[2,1],[],[[3]],{}]}}',
    )
    case("32 levels of objects are accepted", nested(32, "1"))
    case("32 levels of arrays inside the object are accepted", '{"a":' + nested(31, "1", "[", "]") + "}")

    transfer = (
        '{"action":"payments.transfer","intent":null,'
        '"params":{"/amount":5000,"/currency":"EUR","/to":"DE89370400440532013000"}}'
    )
    for variant, params in (
        (
            "original memo",
            '{"amount":5000,"currency":"EUR","to":"DE89370400440532013000","memo":"Invoice 42"}',
        ),
        (
            "memo rewritten by the model",
            '{"memo":"Invoice #42 — office chairs (corrected)",'
            '"to":"DE89370400440532013000","currency":"EUR","amount":5000}',
        ),
        ("memo absent", '{"amount":5000,"currency":"EUR","to":"DE89370400440532013000"}'),
        (
            "extra non-key fields",
            '{"amount":5000.0,"currency":"EUR","to":"DE89370400440532013000","trace":{"id":"t-1"},"memo":null}',
        ),
    ):
        case(
            f"eq:transfer-policy / {variant}",
            params,
            action="payments.transfer",
            key_fields=TRANSFER_KEYS,
            expect=transfer,
        )
    case(
        "eq:transfer-policy / key fields listed in another order",
        '{"amount":5000,"currency":"EUR","to":"DE89370400440532013000","memo":"x"}',
        action="payments.transfer",
        key_fields=["/to", "/amount", "/currency"],
        expect=transfer,
    )
    case(
        "transfer policy with a changed amount",
        '{"amount":5001,"currency":"EUR","to":"DE89370400440532013000","memo":"Invoice 42"}',
        action="payments.transfer",
        key_fields=TRANSFER_KEYS,
    )
    absent = (
        '{"action":"payments.transfer","intent":null,"params":{"/amount":5000,"/currency":null,"/to":null}}'
    )
    case(
        "eq:absent-pointer / absent key fields are null",
        '{"amount":5000}',
        action="payments.transfer",
        key_fields=TRANSFER_KEYS,
        expect=absent,
    )
    case(
        "eq:absent-pointer / explicit nulls",
        '{"amount":5000,"currency":null,"to":null}',
        action="payments.transfer",
        key_fields=TRANSFER_KEYS,
        expect=absent,
    )
    case(
        "rust example: nested pointer absent",
        '{"amount":5}',
        key_fields=["/amount", "/to/iban"],
        expect='{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":null}}',
    )
    iban = '{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":"X"}}'
    case(
        "eq:nested-pointer / with name",
        '{"amount":5,"to":{"iban":"X","name":"Ann"}}',
        key_fields=["/amount", "/to/iban"],
        expect=iban,
    )
    case(
        "eq:nested-pointer / name changed",
        '{"to":{"name":"Anne","iban":"X"},"amount":5}',
        key_fields=["/amount", "/to/iban"],
        expect=iban,
    )
    case(
        "pointer to an object selects the whole canonical object",
        '{"to":{"name":"Ann","iban":"X"},"amount":5}',
        key_fields=["/to"],
        expect='{"action":"pay","intent":null,"params":{"/to":{"iban":"X","name":"Ann"}}}',
    )
    case(
        "pointers with ~0 and ~1 escapes",
        '{"a/b":1,"m~n":2,"c":3}',
        key_fields=["/a~1b", "/m~0n"],
        expect='{"action":"pay","intent":null,"params":{"/a~1b":1,"/m~0n":2}}',
    )
    case(
        "pointer ~01 is ~1, not /",
        '{"~1":"tilde-one","/":"slash"}',
        key_fields=["/~01", "/~1"],
        expect='{"action":"pay","intent":null,"params":{"/~01":"tilde-one","/~1":"slash"}}',
    )
    case(
        "array index pointers, out of range, '-' and leading zero",
        '{"items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}',
        key_fields=["/items/0/sku", "/items/1/qty", "/items/2/sku", "/items/-", "/items/01"],
        expect='{"action":"pay","intent":null,"params":{"/items/-":null,"/items/0/sku":"A",'
        '"/items/01":null,"/items/1/qty":2,"/items/2/sku":null}}',
    )
    case(
        "pointer through a scalar is absent",
        '{"amount":5}',
        key_fields=["/amount/value"],
        expect='{"action":"pay","intent":null,"params":{"/amount/value":null}}',
    )
    case(
        "pointers with empty reference tokens",
        '{"":{"":7}}',
        key_fields=["/", "//"],
        expect='{"action":"pay","intent":null,"params":{"/":{"":7},"//":7}}',
    )
    case(
        "non-ASCII pointer",
        '{"größe":3,"farbe":"rot"}',
        key_fields=["/größe"],
        expect='{"action":"pay","intent":null,"params":{"/größe":3}}',
    )
    case(
        "no key fields at all",
        '{"amount":5}',
        key_fields=[],
        expect='{"action":"pay","intent":null,"params":{}}',
    )

    for name, params in (
        ("top-level duplicate, same value", '{"a":1,"a":1}'),
        ("top-level duplicate, different value", '{"a":1,"a":2}'),
        ("nested duplicate", '{"x":{"a":1,"a":2}}'),
        ("duplicate inside an array", '{"items":[{"sku":"A","sku":"A"}]}'),
        ("duplicate spelled with an escape", '{"a":1,"\\u0061":2}'),
        ("duplicate before an unsafe number", '{"a":1,"a":2,"b":1e300}'),
    ):
        case(name, params, error="duplicate_member")
    for name, params in (
        ("2^53 + 1", '{"n":9007199254740993}'),
        ("-(2^53 + 1)", '{"n":-9007199254740993}'),
        ("2^53 + 2", '{"n":9007199254740994}'),
        ("2^53 + 2 as a float", '{"n":9007199254740994.0}'),
        ("2^53 written with a fraction", '{"n":9007199254740992.0}'),
        ("-2^53 written with a fraction", '{"n":-9007199254740992.0}'),
        ("2^53 written with an exponent", '{"n":9.007199254740992e15}'),
        ("2^53 + 1 with a fraction rounds to 2^53", '{"n":9007199254740993.0}'),
        ("2^64", '{"n":18446744073709551616}'),
        ("-2^64", '{"n":-18446744073709551616}'),
        ("30 digits", '{"n":123456789012345678901234567890}'),
        ("1e16", '{"n":1e16}'),
        ("1e+30", '{"n":1e+30}'),
        ("1e300", '{"n":1e300}'),
        ("-1e300", '{"n":-1e300}'),
        ("1e400 overflows a double", '{"n":1e400}'),
        ("nested in an array", '{"a":{"b":[1,1e300]}}'),
        ("unsafe number before a duplicate", '{"b":1e300,"a":1,"a":2}'),
        ("unsafe number in a top-level array", "[9007199254740993]"),
    ):
        case(f"unsafe number: {name}", params, error="unsafe_number")
    # A literal that JCS would write as another number: two amounts would share a fingerprint.
    for name, params in (
        ("0.1 ETH + 1 wei", '{"amount":0.100000000000000001}'),
        ("underflow to zero", '{"amount":1e-400}'),
        ("reads as the double of 100.00000000000001", '{"amount":100.00000000000002}'),
        ("one and a tiny bit", '{"n":1.000000000000000000001}'),
        ("more digits than the double", '{"n":333333333.33333329}'),
        ("negative", '{"n":-0.1000000000000000001}'),
        ("nested in an array", '{"a":[0.5,{"b":0.30000000000000001}]}'),
        ("after an exact one", '{"a":0.25,"b":2.50000000000000001}'),
        ("the odd one of two shortest forms", '{"n":579460800786596.3}'),
        ("inexact before an unsafe integer is reported as unsafe", '{"a":0.10000000000000000001,"b":1e300}'),
    ):
        case(f"inexact number: {name}", params, error="unsafe_number" if "unsafe" in name else "inexact_number")
    for name, params in (
        ("empty array", "[]"),
        ("array", "[1,2]"),
        ("string", '"amount"'),
        ("number", "42"),
        ("null", "null"),
        ("true", "true"),
    ):
        case(f"not an object: {name}", params, error="not_an_object")
    for name, params in (
        ("empty text", ""),
        ("only whitespace", " \n "),
        ("unclosed object", '{"a":1'),
        ("trailing comma", '{"a":1,}'),
        ("missing colon", '{"a" 1}'),
        ("single quotes", "{'a':1}"),
        ("unquoted name", "{a:1}"),
        ("NaN", '{"a":NaN}'),
        ("Infinity", '{"a":Infinity}'),
        ("-Infinity", '{"a":-Infinity}'),
        ("leading zero", '{"a":01}'),
        ("bare decimal point", '{"a":1.}'),
        ("leading decimal point", '{"a":.5}'),
        ("plus sign", '{"a":+1}'),
        ("empty exponent", '{"a":1e}'),
        ("capitalised literal", '{"a":True}'),
        ("truncated literal", '{"a":tru}'),
        ("trailing characters", "{} x"),
        ("two documents", "{}{}"),
        ("lone leading surrogate", '{"a":"\\ud800"}'),
        ("lone trailing surrogate", '{"a":"\\udc00"}'),
        ("leading surrogate then a letter", '{"a":"\\ud83d\\u0041"}'),
        ("raw control character in a string", '{"a":"x\u0001y"}'),
        ("invalid escape", '{"a":"\\x41"}'),
        ("comment", "// note\n{}"),
        ("byte order mark", "\ufeff{}"),
        ("non-breaking space as whitespace", "\u00a0{}"),
    ):
        case(f"syntax: {name}", params, error="syntax")
    case("too deep: 33 levels of objects", nested(33, "1"), error="too_deep")
    case(
        "too deep: 33 levels with arrays inside", '{"a":' + nested(32, "1", "[", "]") + "}", error="too_deep"
    )
    case(
        "too deep: a top-level array is too deep before it is not an object",
        nested(33, "1", "[", "]"),
        error="too_deep",
    )
    case(
        "too deep: depth is checked before a later duplicate",
        '{"x":' + nested(32, "1") + ',"x":1}',
        error="too_deep",
    )


def check_groups(cases: list[dict[str, Any]]) -> None:
    """Refuses vectors whose ``eq:`` groups do not share one fingerprint."""
    groups: dict[str, set[str]] = defaultdict(set)
    for entry in cases:
        if entry["name"].startswith("eq:"):
            groups[entry["name"].split(" / ")[0]].add(entry["fingerprint"])
    for group, fingerprints in groups.items():
        if len(fingerprints) != 1:
            raise SystemExit(f"{group}: cases differ in fingerprint")
    names = [entry["name"] for entry in cases]
    if len(set(names)) != len(names):
        raise SystemExit("case names must be unique")


def main() -> int:
    """Builds, checks and writes the vectors."""
    build()
    check_groups(CASES)
    document = {"version": 1, "cases": CASES}
    OUTPUT.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(CASES)} cases to {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
