/**
 * Every error of a gate call or of the guard, in one hierarchy:
 *
 * ```
 * OncegateError                       a gate call failed, or the guard could not settle
 * ├── KeyReusedError                  IDEMPOTENCY_KEY_REUSED
 * ├── InProgressError                 IDEMPOTENCY_IN_PROGRESS
 * ├── LeaseExpiredUnresolvedError     LEASE_EXPIRED_UNRESOLVED
 * ├── TokenMismatchError              TOKEN_MISMATCH
 * ├── TokenUnknownError               TOKEN_UNKNOWN
 * ├── CompletedByOtherError           COMPLETED_BY_OTHER
 * ├── AlreadyCompletedError           ALREADY_COMPLETED
 * ├── InvalidRequestError             INVALID_REQUEST
 * ├── UnauthenticatedError            UNAUTHENTICATED
 * ├── ForbiddenScopeError             FORBIDDEN_SCOPE
 * ├── RateLimitedError                RATE_LIMITED
 * ├── StoreUnavailableError           STORE_UNAVAILABLE
 * ├── PolicyDeniedError               POLICY_DENIED
 * ├── BudgetExceededError             BUDGET_EXCEEDED
 * ├── PendingApprovalError            DECISION_PENDING_APPROVAL: nothing ran, an operator decides
 * ├── ReceiptDecodeError              a replayed receipt this client cannot decode
 * ├── TransportError                  no oncegate ErrorInfo: the gate was not reached
 * └── GuardError                      the guard ran the function and could not settle cleanly
 *     ├── FailedError                 definite failure, token released
 *     ├── ReleaseFailedError          definite failure, release not acknowledged
 *     └── OutcomeUnknownError         the token was kept: reconcile
 *         └── CompleteUnacknowledgedError   the function ran; its Complete was not acknowledged
 * ```
 *
 * `LEASE_NOT_EXPIRED`, `APPROVAL_NOT_PENDING` and `ALREADY_SETTLED` (operator and resolver RPCs' answers) and `INTERNAL` (a fault on the gate's side) come
 * as `OncegateError` itself, with `reason` set.
 */

export * from "./gate.js";
export * from "./guard.js";
export * from "./message.js";
export * from "./status.js";
