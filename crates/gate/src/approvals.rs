//! The operator's side of authorization: deciding approvals, listing them, reading an agent's
//! budgets. Validated, timed, counted and audited like every operator operation; the semantics
//! are the domain's ([`oncegate_domain::authorization`]), applied by the store in one atomic step.

use super::{Emitted, Gate, GateError, audit, operator, request};
use oncegate_domain::{
    ActionKey,
    event::{Event, EventType},
    ledger::Millis,
    ledger::{Approval, approval::Decision},
};
use oncegate_observe::telemetry::{self, AUDIT};
use oncegate_store::ApprovalPage;

/// One agent's use of one budget bucket, as the operator read shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetUsage {
    pub budget: String,
    pub action: String,
    pub group: String,
    /// Used within the window and the limit, in the budget's units, as decimal text.
    pub used: String,
    pub limit: String,
    pub window: Millis,
    /// When the oldest counted spending stops counting.
    pub next_release_at: Option<Millis>,
}

impl Gate {
    /// DecideApproval: an operator approves or denies a held action.
    pub async fn decide_approval(
        &self,
        key: &ActionKey,
        decision: Decision,
    ) -> Result<Approval, GateError> {
        self.check_ref(key)?;
        request::check_id(&self.policies.limits, "approval_id", &decision.id, true)?;
        request::check_bytes("note", decision.note.len(), operator::MAX_NOTE_BYTES)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let reply = self
            .timed(
                "decide_approval",
                self.store
                    .decide_approval(key, &decision, self.policies.highest_durability()),
            )
            .await?;
        let name = match &reply.result {
            Ok((_, false)) => "approval_repeated",
            Ok(_) if decision.approve => "approved",
            Ok(_) => "denied",
            Err(refusal) => audit::refusal_name(refusal),
        };
        audit::audit!(info, key, decision = name, approval_id = %decision.id,
            note = %decision.note, "decide_approval");
        if let Ok((approval, _)) = &reply.result {
            // A repeated decision emits it again, with the same id: the outbox keeps one.
            self.emit(EventType::ApprovalDecided, || {
                Emitted::Event(Event::approval_decided(key, approval, reply.now))
            });
        }
        reply
            .result
            .map(|(approval, _)| approval)
            .map_err(GateError::Refused)
    }

    /// ListApprovals: one page of one agent's live approvals, by lapse time.
    pub async fn list_approvals(
        &self,
        agent: &str,
        page_token: &str,
        page_size: u32,
    ) -> Result<ApprovalPage, GateError> {
        request::check_id(&self.policies.limits, "agent_id", agent, true)?;
        let limit = operator::page_limit(page_size)?;
        let after = operator::page_cursor(page_token, |c| c.agent_id == agent)?;
        let reply = self
            .timed(
                "list_approvals",
                self.store
                    .list_approvals(agent, after.as_ref(), limit as usize),
            )
            .await?;
        let page = reply.result.map_err(GateError::Refused)?;
        telemetry::record_decision("listed");
        tracing::info!(target: AUDIT, agent_id = agent, count = page.items.len(),
            decision = "listed", "list_approvals");
        Ok(page)
    }

    /// GetBudgets: every bucket of one agent with spending in its window, judged at the store's
    /// `now` against the budgets configured now (buckets of budgets no longer configured are
    /// left out).
    pub async fn budgets(&self, agent: &str) -> Result<Vec<BudgetUsage>, GateError> {
        request::check_id(&self.policies.limits, "agent_id", agent, true)?;
        let reply = self.timed("get_budgets", self.store.budgets(agent)).await?;
        let now = reply.now;
        let buckets = reply.result.map_err(GateError::Refused)?;
        let mut out = Vec::new();
        for (id, bucket) in buckets {
            let Some(name) = id.rsplit_once(':').map(|(name, _)| name) else {
                continue;
            };
            let Some(budget) = self.authz.budget(name) else {
                continue;
            };
            let used = bucket.used(budget.window, now);
            if used == 0 {
                continue;
            }
            out.push(BudgetUsage {
                budget: budget.name.clone(),
                action: bucket.action.clone(),
                group: bucket.group.clone(),
                used: budget.display(used),
                limit: budget.display(budget.limit),
                window: budget.window,
                next_release_at: bucket.next_release(budget.window, now),
            });
        }
        out.sort_by(|a, b| (&a.budget, &a.action, &a.group).cmp(&(&b.budget, &b.action, &b.group)));
        telemetry::record_decision("read");
        Ok(out)
    }
}
