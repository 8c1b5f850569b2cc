/**
 * oncegate: run each side-effecting action of an agent at most once.
 *
 * It speaks gRPC through Connect-ES; `examples/typescript/` wraps a Vercel AI SDK tool with it.
 *
 * The modules, bottom up; each imports only those below it (`test/layers.test.ts` checks it):
 *
 * - `gen/`: the generated stubs (`npm run generate`).
 * - `address.ts`: a gate's address in its forms (`parseAddress`). No IO.
 * - `fingerprint/`: strict params parsing; the offline fingerprint. No IO.
 * - `models.ts`: plain values converted from the messages.
 * - `errors/`: one hierarchy under `OncegateError`; statuses decoded by reason.
 * - `rpc.ts`: `GateRpc`, the connection and the five worker RPCs.
 * - `guard/`: the at-most-once protocol (`runOnce`) over `rpc.ts`.
 * - `verify.ts`: offline verification of signed grant statements (`verifyGrant`). No IO.
 * - `client.ts`: `GateClient`, the RPCs plus `runOnce`.
 * - `resolver.ts`: `Resolver`, which settles unresolved actions by asking the provider.
 */

export {
  ADDRESS_FORMS,
  ADMIN_TARGET_ENV,
  addressFromEnv,
  DEFAULT_ADDRESS,
  parseAddress,
  TARGET_ENV,
  type Address,
} from "./address.js";
export { GateClient } from "./client.js";
export * from "./errors/index.js";
export { canonicalForm, fingerprint, resolvePointer, type FingerprintOptions } from "./fingerprint/fingerprint.js";
export {
  encodeParams,
  MAX_DEPTH,
  MAX_PARAMS_BYTES,
  ParamsError,
  parseParams,
  type JsonObject,
  type JsonValue,
  type ParamsErrorKind,
} from "./fingerprint/params.js";
export { ErrorReason } from "./gen/oncegate/v1/oncegate_pb.js";
export type { GuardOptions } from "./guard/options.js";
export { jsonDecode, jsonEncode } from "./guard/options.js";
export { runOnce, type GuardedWork, type Outcome } from "./guard/run-once.js";
export {
  ActionState,
  CompletionSource,
  Decision,
  ReceiptFormat,
  ReleaseReason,
  type ActionRecord,
  type ActionRef,
  type Approval,
  type Completion,
  type Grant,
  type RequestTokenResult,
  type Scope,
} from "./models.js";
export {
  Lookup,
  Resolver,
  unresolvedFrom,
  type LookupFn,
  type ResolverLogger,
  type ResolverOptions,
  type Settled,
  type Unresolved,
} from "./resolver.js";
export { GateRpc, type ActionSpec, type GateOptions } from "./rpc.js";
export {
  GRANT_TYPE,
  StatementError,
  verifyGrant,
  type GrantCheck,
  type GrantClaims,
  type StatementErrorKind,
} from "./verify.js";
