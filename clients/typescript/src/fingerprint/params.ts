/**
 * Params as strictly as the gate reads them: a JSON object of at most 64 KiB, nested at most 32
 * levels, without duplicate member names, lone surrogates, or numbers a double cannot hold exactly.
 *
 * `JSON.parse` would keep the last of two duplicate members and round `9007199254740993` to 2^53,
 * so the text is walked by hand, and the first problem in document order is reported, as the
 * gate reports it. This module parses and encodes; it does not canonicalise or hash
 * (`fingerprint.ts` does).
 */

/** The largest accepted params text, in UTF-8 bytes. */
export const MAX_PARAMS_BYTES = 64 * 1024;

/** The deepest accepted nesting of objects and arrays; the top-level object is depth 1. */
export const MAX_DEPTH = 32;

/**
 * The largest accepted magnitude of an integer literal (2^53). A number written with a fraction or
 * an exponent must stay below it: from 2^53 on the literal may already have been rounded.
 */
export const MAX_SAFE_NUMBER = 2 ** 53;

const MAX_SAFE_BIGINT = 2n ** 53n;
const SAFE_INTEGER_DIGITS = String(MAX_SAFE_BIGINT).length;

/** What is wrong with params, in the words of the shared fingerprint vectors. */
export type ParamsErrorKind =
  | "duplicate_member"
  | "unsafe_number"
  | "inexact_number"
  | "not_an_object"
  | "syntax"
  | "too_deep"
  | "too_large";

/** Params the gate would refuse with `INVALID_REQUEST`, found before sending them. */
export class ParamsError extends Error {
  override name = "ParamsError";

  constructor(
    /** The problem, named as in `tests/vectors/fingerprints.json`. */
    readonly kind: ParamsErrorKind,
    message: string,
  ) {
    super(message);
  }
}

/** A JSON value as the parser returns it. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [name: string]: JsonValue };

/** A params object. */
export type JsonObject = { [name: string]: JsonValue };

const WHITESPACE = /[ \t\n\r]*/y;
const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
const HEX4 = /^[0-9a-fA-F]{4}$/;
const ESCAPES: Record<string, string> = {
  '"': '"',
  "\\": "\\",
  "/": "/",
  b: "\b",
  f: "\f",
  n: "\n",
  r: "\r",
  t: "\t",
};
const LITERALS: ReadonlyArray<readonly [string, JsonValue]> = [
  ["true", true],
  ["false", false],
  ["null", null],
];

/** True when `text` holds a UTF-16 surrogate that is not half of a pair. */
export function hasLoneSurrogate(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code >= 0xd800 && code <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (!(next >= 0xdc00 && next <= 0xdfff)) return true;
      i++;
    } else if (code >= 0xdc00 && code <= 0xdfff) {
      return true;
    }
  }
  return false;
}

class Parser {
  private pos = 0;

  /** Where the parser is: JSON Pointer tokens of the enclosing members and indexes. */
  private readonly path: string[] = [];
  /**
   * The first number literal JCS would write as another number, reported once the parse
   * succeeded (the gate checks literals after its parse, so its parse errors come first).
   */
  inexact: ParamsError | null = null;

  constructor(
    private readonly text: string,
    private readonly maxDepth: number,
  ) {}

  document(): JsonValue {
    this.skipWhitespace();
    const value = this.value(0);
    this.skipWhitespace();
    if (this.pos !== this.text.length) throw this.syntax("trailing characters");
    return value;
  }

  private syntax(what: string): ParamsError {
    return new ParamsError("syntax", `params are not valid JSON: ${what} at offset ${this.pos}`);
  }

  private skipWhitespace(): void {
    WHITESPACE.lastIndex = this.pos;
    WHITESPACE.exec(this.text);
    this.pos = WHITESPACE.lastIndex;
  }

  private peek(): string {
    return this.text.charAt(this.pos);
  }

  private value(depth: number): JsonValue {
    const char = this.peek();
    if (char === "{") return this.object(depth);
    if (char === "[") return this.array(depth);
    if (char === '"') return this.string();
    if (char !== "" && "-0123456789".includes(char)) return this.number();
    for (const [literal, value] of LITERALS) {
      if (this.text.startsWith(literal, this.pos)) {
        this.pos += literal.length;
        return value;
      }
    }
    throw this.syntax(char ? "expected a value" : "unexpected end of input");
  }

  private enter(depth: number): void {
    if (depth + 1 > this.maxDepth) {
      throw new ParamsError("too_deep", `params nest deeper than ${this.maxDepth} levels`);
    }
  }

  private object(depth: number): JsonObject {
    this.enter(depth);
    this.pos += 1;
    // Own data properties even for "__proto__": Object.fromEntries defines, it does not assign.
    const members: Array<[string, JsonValue]> = [];
    const names = new Set<string>();
    this.skipWhitespace();
    if (this.peek() === "}") {
      this.pos += 1;
      return {};
    }
    for (;;) {
      if (this.peek() !== '"') throw this.syntax("expected a member name");
      const name = this.string();
      if (names.has(name)) {
        throw new ParamsError("duplicate_member", `params repeat the member name ${JSON.stringify(name)}`);
      }
      names.add(name);
      this.skipWhitespace();
      if (this.peek() !== ":") throw this.syntax("expected ':'");
      this.pos += 1;
      this.skipWhitespace();
      this.path.push(name.replaceAll("~", "~0").replaceAll("/", "~1"));
      members.push([name, this.value(depth + 1)]);
      this.path.pop();
      this.skipWhitespace();
      const char = this.peek();
      this.pos += 1;
      if (char === "}") return Object.fromEntries(members);
      if (char !== ",") throw this.syntax("expected ',' or '}'");
      this.skipWhitespace();
    }
  }

  private array(depth: number): JsonValue[] {
    this.enter(depth);
    this.pos += 1;
    const items: JsonValue[] = [];
    this.skipWhitespace();
    if (this.peek() === "]") {
      this.pos += 1;
      return items;
    }
    for (;;) {
      this.path.push(String(items.length));
      items.push(this.value(depth + 1));
      this.path.pop();
      this.skipWhitespace();
      const char = this.peek();
      this.pos += 1;
      if (char === "]") return items;
      if (char !== ",") throw this.syntax("expected ',' or ']'");
      this.skipWhitespace();
    }
  }

  private string(): string {
    this.pos += 1;
    let value = "";
    for (;;) {
      const char = this.text.charAt(this.pos);
      if (char === "") throw this.syntax("unterminated string");
      if (char === '"') break;
      if (char.charCodeAt(0) < 0x20) throw this.syntax("raw control character in a string");
      if (char !== "\\") {
        value += char;
        this.pos += 1;
        continue;
      }
      const escape = this.text.charAt(this.pos + 1);
      if (escape === "u") {
        const hex = this.text.slice(this.pos + 2, this.pos + 6);
        if (!HEX4.test(hex)) throw this.syntax("invalid \\u escape");
        value += String.fromCharCode(Number.parseInt(hex, 16));
        this.pos += 6;
      } else if (escape in ESCAPES) {
        value += ESCAPES[escape];
        this.pos += 2;
      } else {
        throw this.syntax("invalid escape");
      }
    }
    this.pos += 1;
    if (hasLoneSurrogate(value)) throw this.syntax("lone UTF-16 surrogate in a string");
    return value;
  }

  private number(): number {
    NUMBER.lastIndex = this.pos;
    const match = NUMBER.exec(this.text);
    if (match === null) throw this.syntax("invalid number");
    const literal = match[0];
    this.pos = NUMBER.lastIndex;
    if (match[1] === undefined && match[2] === undefined) {
      // An integer literal: compare exactly; a double would round 2^53 + 1 down to 2^53.
      const digits = literal.startsWith("-") ? literal.slice(1) : literal;
      if (digits.length > SAFE_INTEGER_DIGITS || BigInt(digits) > MAX_SAFE_BIGINT) {
        throw unsafeNumber(literal);
      }
      return Number(literal);
    }
    const number = Number(literal);
    if (!Number.isFinite(number) || Math.abs(number) >= MAX_SAFE_NUMBER) throw unsafeNumber(literal);
    // String(number) is the form JCS writes (ECMAScript's Number::toString).
    if (this.inexact === null && decimal(literal) !== decimal(String(number))) {
      this.inexact = new ParamsError(
        "inexact_number",
        `params hold the number ${literal.slice(0, 40)} at /${this.path.join("/")}, which a double ` +
          `cannot hold: it would be read as ${String(number)}; send it as a string, or rounded to ` +
          "what a double holds",
      );
    }
    return number;
  }
}

/**
 * A decimal literal's exact value as one comparable string (sign, significant digits, exponent),
 * every zero alike.
 */
function decimal(literal: string): string {
  const negative = literal.startsWith("-");
  const unsigned = negative ? literal.slice(1) : literal;
  const [mantissa = "", exponent = "0"] = unsigned.toLowerCase().split("e");
  const [whole = "", fraction = ""] = mantissa.split(".");
  const digits = (whole + fraction).replace(/^0+/, "");
  if (digits === "") return "0";
  const significant = digits.replace(/0+$/, "");
  const scale = BigInt(exponent) - BigInt(fraction.length) + BigInt(digits.length - significant.length);
  return `${negative ? "-" : ""}${significant}e${scale}`;
}

function unsafeNumber(literal: string): ParamsError {
  return new ParamsError(
    "unsafe_number",
    `params hold the number ${literal.slice(0, 40)}, beyond 2^53 in magnitude, which JSON doubles ` +
      "cannot represent exactly",
  );
}

/** Limits of {@link parseParams}; the gate's defaults unless its `[limits]` say otherwise. */
export interface ParseLimits {
  maxBytes?: number;
  maxDepth?: number;
}

/**
 * Parses params text into an object, refusing what the gate refuses.
 *
 * @throws {ParamsError} `too_large`, `syntax`, `duplicate_member`, `unsafe_number`,
 *   `inexact_number`, `too_deep` or `not_an_object`.
 */
export function parseParams(text: string, limits: ParseLimits = {}): JsonObject {
  const { maxBytes = MAX_PARAMS_BYTES, maxDepth = MAX_DEPTH } = limits;
  if (hasLoneSurrogate(text)) {
    throw new ParamsError("syntax", "params are not valid UTF-8 (lone surrogate)");
  }
  const size = Buffer.byteLength(text, "utf8");
  if (size > maxBytes) {
    throw new ParamsError("too_large", `params are ${size} bytes, more than the limit of ${maxBytes}`);
  }
  const parser = new Parser(text, maxDepth);
  const value = parser.document();
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ParamsError("not_an_object", "params must be a JSON object");
  }
  if (parser.inexact !== null) throw parser.inexact;
  return value;
}

/**
 * Serialises a params object as compact JSON text, the form the client sends.
 *
 * `JSON.stringify` would write `NaN` and `Infinity` as `null` (another action) and throw on a
 * `bigint`: both are settled here. A `bigint` within 2^53 is written as the integer it is.
 *
 * @throws {ParamsError} `unsafe_number` for non-finite numbers and larger bigints, `not_an_object`
 *   when `params` does not serialise to an object.
 */
export function encodeParams(params: object): string {
  const text = JSON.stringify(params, (_name, value: unknown) => {
    if (typeof value === "number" && !Number.isFinite(value)) {
      throw new ParamsError("unsafe_number", `params hold ${value}, which JSON cannot carry`);
    }
    if (typeof value === "bigint") {
      if (value > MAX_SAFE_BIGINT || value < -MAX_SAFE_BIGINT) throw unsafeNumber(String(value));
      return Number(value);
    }
    return value;
  }) as string | undefined;
  if (text === undefined || !text.startsWith("{")) {
    throw new ParamsError("not_an_object", "params must be a JSON object");
  }
  return text;
}
