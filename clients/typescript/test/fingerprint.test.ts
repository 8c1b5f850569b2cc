/** The local fingerprint against the shared vectors (as the Rust and Python implementations are). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { canonicalForm, encodeParams, fingerprint, ParamsError, parseParams } from "../src/index.js";
import { CASES, DOCUMENT } from "./support/vectors.js";

function options(testCase: (typeof CASES)[number]) {
  return { intent: testCase.intent, keyFields: testCase.key_fields };
}

describe("the shared vectors", () => {
  it("have the shape the other implementations check", () => {
    assert.equal(DOCUMENT.version, 1);
    assert.ok(CASES.length >= 60);
    assert.equal(new Set(CASES.map((c) => c.name)).size, CASES.length);
    const errors = new Set(CASES.flatMap((c) => (c.error === undefined ? [] : [c.error])));
    assert.deepEqual(
      [...errors].sort(),
      ["duplicate_member", "inexact_number", "not_an_object", "syntax", "too_deep", "unsafe_number"],
    );
  });

  for (const testCase of CASES) {
    it(testCase.name, () => {
      if (testCase.error !== undefined) {
        assert.throws(
          () => fingerprint(testCase.action, testCase.params_json, options(testCase)),
          (error: unknown) => error instanceof ParamsError && error.kind === testCase.error,
        );
      } else {
        assert.equal(canonicalForm(testCase.action, testCase.params_json, options(testCase)), testCase.canonical);
        assert.equal(fingerprint(testCase.action, testCase.params_json, options(testCase)), testCase.fingerprint);
      }
    });
  }

  it("give every equivalence group one fingerprint, and each group its own", () => {
    const groups = new Map<string, Set<string>>();
    for (const testCase of CASES) {
      if (!testCase.name.startsWith("eq:")) continue;
      const group = testCase.name.split(" / ")[0]!;
      groups.set(group, (groups.get(group) ?? new Set()).add(testCase.fingerprint!));
    }
    assert.ok(groups.size >= 10);
    for (const [group, fingerprints] of groups) assert.equal(fingerprints.size, 1, group);
    assert.equal(new Set([...groups.values()].map((fps) => [...fps][0])).size, groups.size);
  });
});

describe("fingerprint", () => {
  it("matches the Rust examples", () => {
    assert.equal(
      canonicalForm("pay", { amount: 5 }, { keyFields: ["/amount", "/to/iban"] }),
      '{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":null}}',
    );
    assert.equal(
      canonicalForm("pay", '{"b":[1,2.5,-0],"a":"é"}'),
      '{"action":"pay","intent":null,"params":{"a":"é","b":[1,2.5,0]}}',
    );
  });

  it("has the v1 format", () => {
    const value = fingerprint("pay", { amount: 1 });
    assert.match(value, /^v1-[0-9a-f]{64}$/);
  });

  it("agrees between an object and its text, and counts the intent", () => {
    const params = { to: { iban: "DE89", name: "Zoë" }, amount: 2 ** 53, rate: 0.1, ok: true, memo: null };
    assert.equal(fingerprint("pay", params), fingerprint("pay", JSON.stringify(params)));
    assert.notEqual(fingerprint("pay", params, { intent: "i-1" }), fingerprint("pay", params));
    assert.equal(fingerprint("pay", params, { intent: "" }), fingerprint("pay", params));
  });

  it("keeps a member named __proto__ as a member", () => {
    const text = '{"__proto__":{"admin":true},"a":1}';
    assert.equal(canonicalForm("pay", text), '{"action":"pay","intent":null,"params":{"__proto__":{"admin":true},"a":1}}');
    assert.notEqual(fingerprint("pay", text), fingerprint("pay", '{"a":1}'));
  });

  it("refuses object values the gate would refuse, instead of sending another action", () => {
    const kind = (params: object) => {
      try {
        fingerprint("pay", params);
      } catch (error) {
        return error instanceof ParamsError ? error.kind : "other";
      }
      return "accepted";
    };
    assert.equal(kind({ amount: 2 ** 53 + 2 }), "unsafe_number");
    assert.equal(kind({ amount: Number.NaN }), "unsafe_number"); // JSON.stringify would write null
    assert.equal(kind({ amount: Number.POSITIVE_INFINITY }), "unsafe_number");
    assert.equal(kind({ amount: 2n ** 60n }), "unsafe_number");
    assert.equal(kind({ amount: "\ud800" }), "syntax");
    assert.equal(kind([1, 2]), "not_an_object");
    assert.equal(kind({ amount: 2n ** 53n }), "accepted");
    assert.equal(fingerprint("pay", { amount: 5n }), fingerprint("pay", { amount: 5 }));
  });

  it("encodes what it sends compactly", () => {
    assert.equal(encodeParams({ b: 1, a: [true, null, "x"] }), '{"b":1,"a":[true,null,"x"]}');
  });

  it("enforces the size and depth limits", () => {
    assert.throws(() => parseParams(JSON.stringify({ memo: "x".repeat(70_000) })), { kind: "too_large" });
    assert.deepEqual(parseParams('{"a":1}', { maxDepth: 1 }), { a: 1 });
    assert.throws(() => parseParams('{"a":[1]}', { maxDepth: 1 }), { kind: "too_deep" });
  });
});
