/**
 * `oncegate/temporal`: the Temporal worker interceptor (`@temporalio/worker`, `@temporalio/common`
 * and `@temporalio/activity` are optional peer dependencies, needed only by this entry point).
 */

export { applicationFailure, FailureType, type FailureOptions } from "./failures.js";
export {
  currentGrant,
  oncegateInterceptor,
  workflowScope,
  type OncegateInterceptorOptions,
} from "./interceptor.js";
