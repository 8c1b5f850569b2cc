//! RequestToken through the gate: validation and the fingerprint, the stateless rules (Cedar),
//! the budgets' charges, one atomic store step (deduplication, approvals, budgets), counting and
//! audit by mode, and shadow mode's grant where enforcement would refuse.

use super::{
    Gate, GateError, Prepared, TokenAnswer, TokenCall, audit,
    authorization::Mode,
    policy::ActionPolicy,
    policy_name, request,
    rules::{Facts, Verdict},
    shadow,
};
use oncegate_domain::{
    authorization::Hold,
    ledger::{GrantKind, Millis, Refusal, TokenOutcome, TokenRequest},
    statement::grant::GrantClaims,
};
use oncegate_observe::{metrics::Decision, telemetry};

/// What the rules let through: the request to put to the store (held or charged), or the
/// answer already decided (a denial, or shadow mode's grant).
enum Ruled {
    Store(TokenRequest),
    Answered(Result<TokenAnswer, GateError>),
}

impl Gate {
    /// RequestToken: validate, fingerprint with the action's key fields, the stateless rules,
    /// then one atomic store step (deduplication, approvals, budgets). Every call is counted in
    /// `oncegate_attempts_total`, by decision and mode, unless the store failed. In shadow mode
    /// (global, or the action's) anything but a grant is counted and audited as it would have
    /// been, and answered with a shadow grant instead.
    pub async fn request_token(&self, call: TokenCall) -> Result<TokenAnswer, GateError> {
        let policy = self.policies.for_action(&call.action);
        let mode = match policy {
            Some(p) if p.shadow => Mode::Shadow,
            _ => self.authz.mode,
        };
        let action = call.action.clone();
        let who = (
            call.principal.clone(),
            call.idempotency_key.clone(),
            call.intent_id.clone(),
        );
        let limits = &self.policies.limits;
        let prepared = match request::prepare_token(limits, policy, call, request::new_token()) {
            Ok(prepared) => prepared,
            Err(e) => return Err(self.invalid(policy, e)),
        };
        let key = prepared.key.clone();
        telemetry::record_action(&key.agent_id, &key.run_id, Some(&action), &key.key);
        let request = if self.authz.is_active() {
            match self.rule(prepared, &action, &who, policy, mode) {
                Ruled::Store(request) => request,
                Ruled::Answered(answer) => {
                    return answer.map(|a| self.signed(a, policy, &action, &who.2, shadow::now()));
                }
            }
        } else {
            prepared.request
        };
        let durability = policy.map_or(0, |p| p.durability_replicas);
        let acked = self
            .timed(
                "request_token",
                self.store.request_token(&key, &request, durability),
            )
            .await?;
        let reply = acked.reply;
        self.count_budgets(&request, &reply.result, mode);
        if let Some(decision) = audit::token_decision(&reply.result) {
            self.metrics
                .attempt_in(policy_name(policy), decision, mode.as_str());
        }
        audit::token(&key, &action, &reply.result, mode);
        let granted = matches!(reply.result, Ok(TokenOutcome::Granted(..)));
        if mode == Mode::Shadow && !granted {
            let answer = self.shadow_grant(key, &request);
            return Ok(self.signed(answer, policy, &action, &who.2, shadow::now()));
        }
        let outcome = reply.result.map_err(|refusal| match refusal {
            Refusal::LeaseExpired { .. } => GateError::Unresolved {
                key: key.clone(),
                refusal,
            },
            refusal => GateError::Refused(refusal),
        })?;
        let answer = TokenAnswer {
            provider_key: key.provider_key(),
            key,
            fingerprint: request.fingerprint,
            outcome,
            replicas_acknowledged: acked.replicas,
            statement: String::new(),
            shadow: false,
        };
        Ok(self.signed(answer, policy, &action, &who.2, reply.now))
    }

    /// `answer` with its signed grant statement when the gate signs and the answer is a grant
    /// (issued at `now`). Shadow grants are signed too: in shadow mode an executor sees what
    /// enforcement would hand out.
    fn signed(
        &self,
        mut answer: TokenAnswer,
        policy: Option<&ActionPolicy>,
        action: &str,
        intent: &str,
        now: Millis,
    ) -> TokenAnswer {
        let (Some(signer), TokenOutcome::Granted(grant, _)) = (&self.signer, &answer.outcome)
        else {
            return answer;
        };
        let claims = GrantClaims {
            iss: signer.issuer().into(),
            aud: policy
                .and_then(|p| p.audience.clone())
                .unwrap_or_else(|| action.to_owned()),
            iat: now.div_euclid(1000),
            exp: grant.lease_expires_at.div_euclid(1000),
            agent: answer.key.agent_id.clone(),
            run: answer.key.run_id.clone(),
            action: action.to_owned(),
            key: answer.key.key.clone(),
            intent: intent.to_owned(),
            fingerprint: answer.fingerprint.clone(),
            fencing: grant.fencing,
            provider_key: answer.provider_key.clone(),
        };
        answer.statement = signer.sign_grant(&claims);
        answer
    }

    /// The rules' verdict and the budgets' charges: a denial ends here (a shadow grant in shadow
    /// mode, and so does a hold); a hold becomes the request's `hold`.
    fn rule(
        &self,
        prepared: Prepared,
        action: &str,
        (principal, idempotency_key, intent_id): &(String, String, String),
        policy: Option<&ActionPolicy>,
        mode: Mode,
    ) -> Ruled {
        let Prepared {
            key,
            mut request,
            params,
        } = prepared;
        let params = serde_json::Value::Object(params);
        let verdict = self.authz.verdict(&Facts {
            principal,
            agent_id: &key.agent_id,
            run_id: &key.run_id,
            action,
            idempotency_key,
            intent_id,
            params: &params,
        });
        let refused = |decision: Decision| {
            self.metrics
                .attempt_in(policy_name(policy), decision, mode.as_str());
        };
        match verdict {
            Verdict::Allow => {}
            Verdict::Deny { policy: by } => {
                audit::policy_denied(&key, action, &by, mode);
                refused(Decision::PolicyDenied);
                return Ruled::Answered(match mode {
                    Mode::Enforce => Err(GateError::PolicyDenied { policy: by }),
                    Mode::Shadow => Ok(self.shadow_grant(key, &request)),
                });
            }
            Verdict::Hold { policy: by, .. } if mode == Mode::Shadow => {
                audit::held(&key, action, &by, "", mode);
                refused(Decision::PendingApproval);
                return Ruled::Answered(Ok(self.shadow_grant(key, &request)));
            }
            Verdict::Hold { policy: by, reason } => {
                request.hold = Some(Hold {
                    policy: by,
                    reason,
                    new_id: request::new_token(),
                    ttl: self.authz.approval_ttl,
                    action: action.to_owned(),
                });
            }
        }
        let serde_json::Value::Object(params) = params else {
            unreachable!("built from a map above")
        };
        match self.authz.charges(action, &params) {
            Ok(charges) => request.charges = charges,
            Err(e) => return Ruled::Answered(Err(self.invalid(policy, e))),
        }
        Ruled::Store(request)
    }

    /// Counts the budget checks of a grant (reserved) or of its refusal (exceeded).
    fn count_budgets(
        &self,
        request: &TokenRequest,
        result: &Result<TokenOutcome, Refusal>,
        mode: Mode,
    ) {
        match result {
            Ok(TokenOutcome::Granted(_, GrantKind::New | GrantKind::Regranted)) => {
                for charge in &request.charges {
                    self.metrics
                        .budget(&charge.budget, "reserved", mode.as_str());
                }
            }
            Err(Refusal::BudgetExceeded { budget, .. }) => {
                self.metrics.budget(budget, "exceeded", mode.as_str());
            }
            _ => {}
        }
    }
}
