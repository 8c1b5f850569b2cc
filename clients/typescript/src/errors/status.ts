/**
 * Decoding a failed call: a status with rich details becomes the error class of its reason.
 *
 * Every gate error is a gRPC status carrying one `google.rpc.ErrorInfo` (domain `oncegate`) in
 * `grpc-status-details-bin`, which Connect decodes into `ConnectError.details`.
 * {@link fromCallError} turns it into the class named by the reason ({@link BY_REASON}), with the
 * metadata, `RetryInfo` and `BadRequest` read. A status without an oncegate `ErrorInfo` (a
 * deadline, a refused connection, a proxy's answer) becomes a {@link TransportError}.
 */

import { ConnectError } from "@connectrpc/connect";
import { durationMs } from "@bufbuild/protobuf/wkt";

import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { ErrorReason } from "../gen/oncegate/v1/oncegate_pb.js";
import {
  AlreadyCompletedError,
  BudgetExceededError,
  CompletedByOtherError,
  DOMAIN,
  ForbiddenScopeError,
  InProgressError,
  InvalidRequestError,
  KeyReusedError,
  LeaseExpiredUnresolvedError,
  OncegateError,
  parseInteger,
  PolicyDeniedError,
  RateLimitedError,
  reasonName,
  StoreUnavailableError,
  TokenMismatchError,
  TokenUnknownError,
  TransportError,
  UnauthenticatedError,
} from "./gate.js";

/** The class of each `ErrorReason` (every value but `ERROR_REASON_UNSPECIFIED`). */
export const BY_REASON: ReadonlyMap<string, typeof OncegateError> = new Map<string, typeof OncegateError>([
  ...[
    KeyReusedError,
    InProgressError,
    LeaseExpiredUnresolvedError,
    TokenMismatchError,
    TokenUnknownError,
    CompletedByOtherError,
    AlreadyCompletedError,
    InvalidRequestError,
    UnauthenticatedError,
    ForbiddenScopeError,
    RateLimitedError,
    StoreUnavailableError,
    PolicyDeniedError,
    BudgetExceededError,
  ].map((cls): [string, typeof OncegateError] => [cls.REASON, cls]),
  // Four reasons get the root class, with `reason` set: LEASE_NOT_EXPIRED, APPROVAL_NOT_PENDING
  // and ALREADY_SETTLED answer only operator and resolver RPCs (ResolveExpired, DecideApproval),
  // which a worker does not call; INTERNAL is a fault on the gate's side (logged there) that a
  // caller can only report.
  [reasonName(ErrorReason.LEASE_NOT_EXPIRED), OncegateError],
  [reasonName(ErrorReason.APPROVAL_NOT_PENDING), OncegateError],
  [reasonName(ErrorReason.ALREADY_SETTLED), OncegateError],
  [reasonName(ErrorReason.INTERNAL), OncegateError],
]);

/** Maps whatever a gate call threw to the error of its `ErrorInfo` reason. */
export function fromCallError(error: unknown): OncegateError {
  if (error instanceof OncegateError) return error;
  const status = ConnectError.from(error);
  const info = status.findDetails(ErrorInfoSchema).find((candidate) => candidate.domain === DOMAIN);
  const retry = status.findDetails(RetryInfoSchema)[0];
  let retryAfterMs = retry?.retryDelay ? durationMs(retry.retryDelay) : undefined;
  const fieldViolations = status
    .findDetails(BadRequestSchema)
    .flatMap((bad) => bad.fieldViolations.map(({ field, description }) => ({ field, description })));
  const message = status.rawMessage || status.message;
  if (info === undefined) {
    return new TransportError(message, { code: status.code, retryAfterMs, fieldViolations, cause: error });
  }
  if (retryAfterMs === undefined) retryAfterMs = parseInteger(info.metadata["retry_after_ms"]);
  const cls = BY_REASON.get(info.reason) ?? OncegateError;
  return new cls(message, {
    reason: info.reason,
    code: status.code,
    metadata: info.metadata,
    retryAfterMs,
    fieldViolations,
    cause: error,
  });
}
