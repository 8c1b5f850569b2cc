/** The shared fingerprint vectors (tests/vectors/fingerprints.json). */

import { readFileSync } from "node:fs";

import type { ParamsErrorKind } from "../../src/index.js";
import { VECTORS } from "./paths.js";

export interface VectorCase {
  name: string;
  action: string;
  params_json: string;
  intent: string | null;
  key_fields: string[] | null;
  canonical?: string;
  fingerprint?: string;
  error?: ParamsErrorKind;
}

export const DOCUMENT = JSON.parse(readFileSync(VECTORS, "utf8")) as { version: number; cases: VectorCase[] };
export const CASES = DOCUMENT.cases;
