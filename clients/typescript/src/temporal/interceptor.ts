/**
 * Temporal: an `ActivityInboundCallsInterceptor` that runs each side-effecting activity at most
 * once, for `@temporalio/worker` (an optional peer dependency: `import from "oncegate/temporal"`).
 *
 * ```ts
 * const worker = await Worker.create({
 *   connection, taskQueue: "billing", activities,
 *   interceptors: { activity: [oncegateInterceptor(gate, { activities: { transfer: "payments.transfer" } })] },
 * });
 * ```
 *
 * The mapping is the Python interceptor's: agent = the workflow id, run = its run id (`scope`
 * changes it); the key = the activity id, never the attempt number, so attempt 2 of a completed
 * activity replays attempt 1's result; the params = the activity's one object argument, else
 * `{ args }`. When the activity has a heartbeat timeout, the lease is that timeout and each
 * `heartbeat()` extends it; otherwise the guard's own heartbeat keeps it. The workflow sees the
 * `ApplicationFailure`s of `failures.ts`. Activities read their grant with {@link currentGrant}.
 *
 * It owns the mapping between Temporal and the guard; the protocol is `runOnce`'s.
 */

import { AsyncLocalStorage } from "node:async_hooks";

import type { Context as ActivityContext, Info } from "@temporalio/activity";
import type {
  ActivityExecuteInput,
  ActivityInboundCallsInterceptor,
  ActivityInterceptors,
  ActivityInterceptorsFactory,
  Next,
} from "@temporalio/worker";

import { OncegateError } from "../errors/gate.js";
import { FailedError } from "../errors/guard.js";
import type { GuardOptions } from "../guard/options.js";
import { runOnce } from "../guard/run-once.js";
import type { ActionRef, Grant } from "../models.js";
import type { ActionSpec, GateRpc } from "../rpc.js";
import { applicationFailure, type FailureOptions } from "./failures.js";

/** What the interceptor guards, and how. */
export interface OncegateInterceptorOptions {
  /** The activity types to guard: type → action name, or a list (the type is the action). */
  activities: Record<string, string> | readonly string[];
  /** The scope of an activity: the workflow id as the agent, its run id as the run, by default. */
  scope?: (info: Info) => { agentId: string; runId: string };
  /** Its idempotency key: the activity id by default. */
  key?: (info: Info) => string;
  /** The lease in ms: the heartbeat timeout when the activity has one, else this, else the policy's. */
  leaseTtlMs?: number;
  /** The guard's options; `maxWait` is 0 unless given (Temporal waits, with the gate's delay). */
  guard?: GuardOptions;
  /** Make `OncegateOutcomeUnknown` retryable after the rest of the lease. */
  retryUnknown?: boolean;
  /** The retry delay of `OncegateUnresolved` and `OncegatePendingApproval`, in ms (30 s). */
  waitDelayMs?: number;
}

const grants = new AsyncLocalStorage<Grant>();

/** The grant of the guarded activity running now: pass its `providerKey` to the provider. */
export function currentGrant(): Grant {
  const grant = grants.getStore();
  if (grant === undefined) throw new Error("oncegate: no guarded activity is running here (list it in `activities`)");
  return grant;
}

/** The default scope: the workflow id as the agent, its run id as the run. */
export function workflowScope(info: Info): { agentId: string; runId: string } {
  return {
    agentId: info.workflowExecution?.workflowId ?? info.activityType,
    runId: info.workflowExecution?.runId ?? info.activityId,
  };
}

/** The interceptor factory for `interceptors.activity` (`Worker.create`, `MockActivityEnvironment`). */
export function oncegateInterceptor(gate: GateRpc, options: OncegateInterceptorOptions): ActivityInterceptorsFactory {
  const actions: Record<string, string> = Array.isArray(options.activities)
    ? Object.fromEntries((options.activities as readonly string[]).map((name) => [name, name]))
    : { ...(options.activities as Record<string, string>) };
  const failures: FailureOptions = {
    retryUnknown: options.retryUnknown ?? false,
    waitDelayMs: options.waitDelayMs ?? 30_000,
  };
  return (ctx: ActivityContext): ActivityInterceptors => {
    const inbound: ActivityInboundCallsInterceptor = {
      async execute(input: ActivityExecuteInput, next: Next<ActivityInboundCallsInterceptor, "execute">) {
        const action = actions[ctx.info.activityType];
        if (action === undefined) return next(input);
        const scope = (options.scope ?? workflowScope)(ctx.info);
        const spec: ActionSpec = {
          ...scope,
          action,
          params: paramsOf(input.args),
          idempotencyKey: (options.key ?? ((info: Info) => info.activityId))(ctx.info),
          leaseTtlMs: options.leaseTtlMs,
        };
        let guard: GuardOptions = { maxWait: 0, ...options.guard };
        const heartbeatTimeout = ctx.info.heartbeatTimeoutMs;
        if (heartbeatTimeout) {
          // Temporal's heartbeats say whether the attempt lives: the lease follows them.
          spec.leaseTtlMs = options.leaseTtlMs ?? Math.max(1_000, heartbeatTimeout);
          guard = { ...guard, heartbeat: false };
        }
        try {
          const outcome = await runOnce(
            gate,
            spec,
            (grant) => {
              const restore = heartbeatTimeout ? extendOnHeartbeats(ctx, gate, spec, grant) : () => {};
              return grants.run(grant, () => next(input)).finally(restore);
            },
            guard,
          );
          return outcome.result;
        } catch (error) {
          if (error instanceof OncegateError && !(error instanceof FailedError)) {
            throw applicationFailure(error, spec, failures);
          }
          throw error;
        }
      },
    };
    return { inbound };
  };
}

/** The params of an activity's arguments: its one object argument, else `{ args }`. */
function paramsOf(args: readonly unknown[]): object {
  const [first] = args;
  if (args.length === 1 && typeof first === "object" && first !== null && !Array.isArray(first)) return first;
  return { args };
}

/**
 * Extends the lease on the activity's heartbeats, at most once a third of the lease (an activity
 * may heartbeat far more often); returns what puts the context's own heartbeat back.
 */
function extendOnHeartbeats(ctx: ActivityContext, gate: GateRpc, spec: ActionSpec, grant: Grant): () => void {
  const lease = spec.leaseTtlMs ?? 1_000;
  // With an idempotency key, the action's key is that key (the contract's action key).
  const action: ActionRef = { scope: { agentId: spec.agentId, runId: spec.runId }, key: spec.idempotencyKey ?? "" };
  const own = ctx.heartbeat;
  let last = Date.now();
  const context = ctx as { heartbeat: (details?: unknown) => void };
  context.heartbeat = (details?: unknown) => {
    own(details);
    if (Date.now() - last < lease / 3) return;
    last = Date.now();
    gate.extendLease(action, grant.token, lease).catch((error: unknown) => {
      ctx.log.warn(`oncegate: extending the lease of ${action.key} failed: ${String(error)}`);
    });
  };
  return () => {
    context.heartbeat = own;
  };
}
