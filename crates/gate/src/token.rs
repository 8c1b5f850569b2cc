//! RequestToken through the gate: validation and the fingerprint, the stateless rules (Cedar),
//! the budgets' charges, one atomic store step (deduplication, approvals, budgets), then one
//! [`TokenDecision`] that is counted, audited, signed and answered (with shadow mode's grant where
//! enforcement would not grant).

use super::{
    Emitted, Gate, GateError, Prepared, TokenAnswer, TokenCall, audit,
    authorization::Mode,
    decision::TokenDecision,
    error::OverBudget,
    policy::ActionPolicy,
    policy_name, request,
    rules::{Facts, Verdict},
    shadow,
};
use oncegate_domain::{
    ActionKey,
    event::{Event, EventType, Lapsed, Requested},
    ledger::{Exceeded, GrantKind, Hold, Millis, Pending, TokenOutcome},
    statement::grant::GrantClaims,
};
use oncegate_observe::telemetry;

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
        let limits = &self.policies.limits;
        let mut prepared = request::prepare_token(limits, policy, call, request::new_token())
            .map_err(|e| self.invalid(policy, e))?;
        let key = &prepared.key;
        telemetry::record_action(&key.agent_id, &key.run_id, Some(&prepared.action), &key.key);
        let ruled = match self.authz.is_active() {
            true => self.rule(&mut prepared, mode),
            false => Ok(None),
        };
        let (decision, now, replicas) = match ruled.map_err(|e| self.invalid(policy, e))? {
            Some(decision) => (decision, shadow::now(), 0),
            None => {
                let durability = policy.map_or(0, |p| p.durability_replicas);
                let store = self
                    .store
                    .request_token(&prepared.key, &prepared.request, durability);
                let reply = self.timed("request_token", store).await?;
                (
                    TokenDecision::from_step(reply.result)?,
                    reply.now,
                    reply.replicas,
                )
            }
        };
        self.count(&prepared, &decision, mode, policy);
        self.remember(&prepared.key, &prepared.action, &decision, mode, now);
        self.emit_token_events(&prepared, &decision, mode, now);
        let Prepared {
            key,
            request,
            action,
            intent_id,
            ..
        } = prepared;
        if mode == Mode::Shadow && !decision.is_grant() {
            let answer = self.shadow_grant(key, &request);
            return Ok(self
                .signed(answer, policy, &action, &intent_id, shadow::now())
                .await);
        }
        let outcome = match decision {
            TokenDecision::BudgetExceeded(exceeded) => {
                return Err(self.over_budget(exceeded, now));
            }
            decision => decision.into_outcome(&key)?,
        };
        let answer = TokenAnswer {
            provider_key: key.provider_key(),
            outcome,
            key,
            fingerprint: request.fingerprint,
            replicas_acknowledged: replicas,
            statement: String::new(),
            shadow: false,
        };
        Ok(self.signed(answer, policy, &action, &intent_id, now).await)
    }

    /// A budget refusal in the budget's own units, with when it frees up (`now`: the store's
    /// time of the refusal).
    fn over_budget(&self, exceeded: Exceeded, now: Millis) -> GateError {
        let budget = self
            .authz
            .budgets
            .iter()
            .find(|b| b.name == exceeded.budget);
        let display = |units: u64| budget.map_or_else(|| units.to_string(), |b| b.display(units));
        GateError::OverBudget(Box::new(OverBudget {
            used: display(exceeded.used),
            limit: display(exceeded.limit),
            requested: display(exceeded.requested),
            window: budget.map_or(0, |b| b.window),
            retry_at: exceeded.retry_after.map(|ms| now + ms),
            retry_after: exceeded.retry_after,
            budget: exceeded.budget,
        }))
    }

    /// Counts and audits a decision: the attempt by its label and mode, the budget checks of a
    /// new token (reserved) or of a refusal (exceeded), the audit line.
    fn count(
        &self,
        prepared: &Prepared,
        decision: &TokenDecision,
        mode: Mode,
        policy: Option<&ActionPolicy>,
    ) {
        self.metrics
            .attempt_in(policy_name(policy), decision.label(), mode.as_str());
        if decision.is_new_token() {
            for charge in &prepared.request.charges {
                self.metrics
                    .budget(&charge.budget, "reserved", mode.as_str());
            }
        }
        if let TokenDecision::BudgetExceeded(exceeded) = decision {
            self.metrics
                .budget(&exceeded.budget, "exceeded", mode.as_str());
        }
        audit::token(&prepared.key, &prepared.action, decision, mode);
    }

    /// The events a RequestToken's decision emits: a hold asks for an approval; a lease that ended
    /// unresolved (met, or regranted) is `action.unresolved`; an enforced budget refusal is
    /// counted into `budget.exceeded`. Shadow mode's would-be holds and refusals emit nothing.
    fn emit_token_events(
        &self,
        prepared: &Prepared,
        decision: &TokenDecision,
        mode: Mode,
        now: Millis,
    ) {
        let key = &prepared.key;
        match decision {
            TokenDecision::Held(pending) if !pending.id.is_empty() => {
                self.emit(EventType::ApprovalRequested, || {
                    let asked = Requested {
                        action: &prepared.action,
                        principal: &prepared.request.principal,
                        params: Some(&prepared.params),
                    };
                    Emitted::Event(Event::approval_requested(key, pending, asked, now))
                })
            }
            TokenDecision::LeaseExpired {
                fencing,
                expired_at,
                ..
            } => self.emit(EventType::ActionUnresolved, || {
                let lapsed = Lapsed {
                    fencing: *fencing,
                    lease_expired_at: Some(*expired_at),
                    holder: "",
                    fingerprint: &prepared.request.fingerprint,
                    action: Some(&prepared.action),
                };
                Emitted::Event(Event::action_unresolved(key, lapsed, now))
            }),
            TokenDecision::Granted {
                grant,
                kind: GrantKind::Regranted,
            } => self.emit(EventType::ActionUnresolved, || {
                // The grant before this one ended unresolved; the regrant is how it was found.
                let lapsed = Lapsed {
                    fencing: grant.fencing.saturating_sub(1),
                    lease_expired_at: None,
                    holder: "",
                    fingerprint: &prepared.request.fingerprint,
                    action: Some(&prepared.action),
                };
                Emitted::Event(Event::action_unresolved(key, lapsed, now))
            }),
            TokenDecision::BudgetExceeded(exceeded) if mode == Mode::Enforce => {
                self.emit(EventType::BudgetExceeded, || Emitted::BudgetRefused {
                    budget: exceeded.budget.clone(),
                    agent_id: key.agent_id.clone(),
                    action: prepared.action.clone(),
                    at: now,
                })
            }
            _ => {}
        }
    }

    /// `answer` with its signed grant statement when the gate signs and the answer is a grant
    /// (issued at `now`). Shadow grants are signed too: in shadow mode an executor sees what
    /// enforcement would hand out.
    async fn signed(
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
        answer.statement = match &self.signing_thread {
            Some(thread) => thread.sign(signer, claims).await,
            None => signer.sign_grant(&claims),
        };
        answer
    }

    /// The rules' verdict and the budgets' charges. A denial is the decision (`Some`), and so is
    /// a hold in shadow mode (none is asked for); otherwise the request goes to the store, held
    /// (its `hold` set) and charged (its `charges`). An error: a charge the params cannot give.
    fn rule(
        &self,
        prepared: &mut Prepared,
        mode: Mode,
    ) -> Result<Option<TokenDecision>, GateError> {
        let key: &ActionKey = &prepared.key;
        let verdict = self.authz.verdict(&Facts {
            principal: &prepared.request.principal,
            agent_id: &key.agent_id,
            run_id: &key.run_id,
            action: &prepared.action,
            idempotency_key: prepared.idempotency_key(),
            intent_id: &prepared.intent_id,
            params: &prepared.params,
        });
        match verdict {
            Verdict::Allow => {}
            Verdict::Deny { policy } => return Ok(Some(TokenDecision::PolicyDenied { policy })),
            Verdict::Hold { policy, reason } if mode == Mode::Shadow => {
                return Ok(Some(TokenDecision::Held(Pending {
                    id: String::new(),
                    expires_at: 0,
                    policy,
                    reason,
                })));
            }
            Verdict::Hold { policy, reason } => {
                prepared.request.hold = Some(Hold {
                    policy,
                    reason,
                    new_id: request::new_token(),
                    ttl: self.authz.approval_ttl,
                    action: prepared.action.clone(),
                    params: prepared.params_json.clone(),
                });
            }
        }
        prepared.request.charges = self.authz.charges(&prepared.action, &prepared.params)?;
        Ok(None)
    }
}
