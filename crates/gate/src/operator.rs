//! The operator operations: completions done by hand, expired leases settled after reconciliation,
//! and the list of unresolved actions. Validated, timed, counted and audited like the worker
//! operations; the semantics are the ledger's ([`oncegate_domain::ledger::record_external`],
//! [`oncegate_domain::ledger::resolve_expired`]) applied by the store in one atomic step. Who may
//! call them (an operator principal) is the `grpc` layer's check, made before these run.

use super::{Gate, GateError, audit, request};
use oncegate_domain::{
    ActionKey,
    ledger::{
        CompleteOutcome, ExternalCompletion, OperatorReceipt, ReceiptFormat, Resolution, Resolved,
        Source,
    },
    statement::receipt::ChainEntry,
};
use oncegate_observe::telemetry::{self, AUDIT};
use oncegate_store::{ListCursor, OutboxPage, Page};

/// The name of a receipt format in audit lines.
fn format_name(format: ReceiptFormat) -> &'static str {
    match format {
        ReceiptFormat::Unspecified => "unspecified",
        ReceiptFormat::Json => "json",
        ReceiptFormat::Text => "text",
    }
}

/// Longest operator note, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;
/// Default ListUnresolved page.
pub const DEFAULT_PAGE: u32 = 100;
/// Largest ListUnresolved page.
pub const MAX_PAGE: u32 = 1000;

/// A listing's page size: `page_size`, or [`DEFAULT_PAGE`] for 0; more than [`MAX_PAGE`] is
/// refused.
pub(crate) fn page_limit(page_size: u32) -> Result<u32, GateError> {
    match page_size {
        0 => Ok(DEFAULT_PAGE),
        n if n <= MAX_PAGE => Ok(n),
        _ => Err(GateError::invalid(
            "page_size",
            format!("must be at most {MAX_PAGE}"),
        )),
    }
}

/// Where a listing resumes: `None` for the first page (an empty token), else the cursor the
/// previous page returned, which must be one of this listing's (`ours`).
pub(crate) fn page_cursor(
    token: &str,
    ours: impl Fn(&ListCursor) -> bool,
) -> Result<Option<ListCursor>, GateError> {
    if token.is_empty() {
        return Ok(None);
    }
    ListCursor::decode(token)
        .filter(|c| ours(c))
        .map(Some)
        .ok_or_else(|| GateError::invalid("page_token", "is not a token this listing returned"))
}

/// Who settles an expired lease: a person, or an automatic resolver that asked the provider. It
/// is the `resolved_by` of the audit line and of `oncegate_resolutions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolvedBy {
    /// An operator principal (a person, or a tool acting for one).
    Operator,
    /// A resolver principal: it may watch unresolved actions and settle them, nothing else.
    Resolver,
}

impl ResolvedBy {
    /// Its label value (one of `oncegate_observe::metrics::RESOLVED_BY`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Resolver => "resolver",
        }
    }
}

/// A ResolveExpired as the gate receives it.
#[derive(Debug, Clone)]
pub struct Settlement {
    pub key: ActionKey,
    pub resolution: Resolution,
    /// Audited for both resolutions; kept with a completion.
    pub note: String,
    /// Settle only the unresolved grant with this fencing number (a resolver's condition).
    pub expected_fencing: Option<u64>,
    pub resolved_by: ResolvedBy,
}

/// A page of an agent's receipt chain.
#[derive(Debug, Clone)]
pub struct ReceiptPage {
    /// In chain order, as stored.
    pub entries: Vec<ChainEntry>,
    /// The `after` of the next page; 0 when this one is the last.
    pub next_after: u64,
    /// The gate's public keys as a JWKS document; empty when it does not sign.
    pub jwks: String,
}

/// An operator's record of an action done by hand, as the gate receives it.
#[derive(Debug, Clone, Default)]
pub struct ExternalCall {
    pub key: ActionKey,
    pub receipt: Vec<u8>,
    /// What the receipt is: JSON or text (required, checked).
    pub format: ReceiptFormat,
    pub note: String,
    /// The operator principal's name.
    pub operator: String,
    /// The action's name, params and intent, when the action has no record yet: its request hash
    /// is computed from them exactly as RequestToken would.
    pub action_name: String,
    pub params_json: String,
    pub intent_id: String,
}

impl Gate {
    /// RecordExternalCompletion: mark an action completed by hand.
    pub async fn record_external(&self, call: ExternalCall) -> Result<CompleteOutcome, GateError> {
        let key = &call.key;
        self.check_operator_input(key, &call.receipt, call.format, &call.note)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let request = request::operator_request_hash(
            &self.policies,
            key,
            &call.action_name,
            &call.params_json,
            &call.intent_id,
        )?;
        let ext = ExternalCompletion {
            written: OperatorReceipt {
                receipt: call.receipt,
                format: call.format,
                note: call.note,
                operator: call.operator,
            },
            request,
        };
        let reply = self
            .timed(
                "record_external",
                self.store.record_external(
                    key,
                    &ext,
                    self.policies.highest_durability(),
                    self.receipts().as_ref(),
                ),
            )
            .await?;
        let (decision, fencing) = match &reply.result {
            Ok(done) if done.recorded => ("completed_by_operator", done.completion.fencing),
            Ok(done) => ("operator_completion_repeated", done.completion.fencing),
            Err(refusal) => (audit::refusal_name(refusal), 0),
        };
        audit::audit!(info, key, decision = decision, fencing, note = %ext.written.note,
            receipt_format = format_name(ext.written.format), "record_external_completion");
        let done = reply.result.map_err(GateError::Refused)?;
        if done.recorded {
            self.metrics.completion(Source::Operator);
        }
        Ok(done)
    }

    /// ResolveExpired: settle an expired lease as completed (an operator completion) or failed
    /// (released, fencing kept); with an expected fencing number, only that unresolved grant
    /// (`ALREADY_SETTLED` otherwise). Audited and counted with who settled it.
    pub async fn resolve_expired(&self, settlement: Settlement) -> Result<Resolved, GateError> {
        let Settlement {
            key,
            resolution,
            note,
            expected_fencing,
            resolved_by,
        } = settlement;
        let (key, note) = (&key, note.as_str());
        match &resolution {
            Resolution::Completed(written) => {
                self.check_operator_input(key, &written.receipt, written.format, note)?
            }
            Resolution::Failed => self.check_ref(key)?,
        }
        request::check_bytes("note", note.len(), MAX_NOTE_BYTES)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let reply = self
            .timed(
                "resolve_expired",
                self.store.resolve_expired(
                    key,
                    &resolution,
                    expected_fencing,
                    self.policies.highest_durability(),
                    self.receipts().as_ref(),
                ),
            )
            .await?;
        let (decision, fencing) = match &reply.result {
            Ok(Resolved::Completed(done)) => ("resolved_completed", done.fencing),
            Ok(Resolved::Released { fencing }) => ("resolved_failed", *fencing),
            Err(refusal) => (audit::refusal_name(refusal), 0),
        };
        let expected_fencing = expected_fencing.unwrap_or(0);
        audit::audit!(
            info,
            key,
            decision = decision,
            fencing,
            expected_fencing,
            resolved_by = resolved_by.as_str(),
            note,
            "resolve_expired"
        );
        let resolved = reply.result.map_err(GateError::Refused)?;
        match &resolved {
            Resolved::Completed(_) => self.metrics.completion(Source::Operator),
            Resolved::Released { .. } => self.metrics.release("resolved_failed"),
        }
        let completed = matches!(resolved, Resolved::Completed(_));
        self.metrics.resolution(resolved_by.as_str(), completed);
        Ok(resolved)
    }

    /// ListUnresolved: one page of expired leases without Complete or Release, of `agent` or of
    /// every agent. `page_token` is the previous page's `next` (empty for the first page); a
    /// `page_size` of 0 means the default.
    pub async fn list_unresolved(
        &self,
        agent: Option<&str>,
        page_token: &str,
        page_size: u32,
    ) -> Result<Page, GateError> {
        if let Some(agent) = agent {
            request::check_id(&self.policies.limits, "agent_id", agent, true)?;
        }
        let limit = page_limit(page_size)?;
        let after = page_cursor(page_token, |c| agent.is_none_or(|a| a == c.agent_id))?;
        let reply = self
            .timed(
                "list_unresolved",
                self.store
                    .list_unresolved(agent, after.as_ref(), limit as usize),
            )
            .await?;
        let page = reply.result.map_err(GateError::Refused)?;
        telemetry::record_decision("listed");
        tracing::info!(target: AUDIT, agent_id = agent.unwrap_or("*"), count = page.items.len(),
            decision = "listed", "list_unresolved");
        Ok(page)
    }

    /// ExportReceipts: one page of `agent`'s receipt chain after entry `after`, as stored, with
    /// the public keys (JWKS) of this gate (empty when it does not sign). A `page_size` of 0 means
    /// the default.
    pub async fn receipt_chain(
        &self,
        agent: &str,
        after: u64,
        page_size: u32,
    ) -> Result<ReceiptPage, GateError> {
        request::check_id(&self.policies.limits, "agent_id", agent, true)?;
        let limit = page_limit(page_size)?;
        // One more than asked: whether a next page exists, without a second read. The first page
        // starts with the chain sealed, so that every entry recorded so far is covered by a
        // signed head (Redis signs heads once per interval otherwise); one timed store call.
        let signer = self.receipts().filter(|_| after == 0);
        let read = async {
            if let Some(signer) = &signer {
                self.store.seal_receipts(agent, signer).await?;
            }
            self.store.receipts(agent, after, limit as usize + 1).await
        };
        let mut entries = self.timed("export_receipts", read).await?;
        let next_after = match entries.len() > limit as usize {
            true => {
                entries.truncate(limit as usize);
                entries.last().map_or(0, |e| e.core.seq)
            }
            false => 0,
        };
        telemetry::record_decision("exported");
        tracing::info!(target: AUDIT, agent_id = agent, count = entries.len(), after,
            decision = "exported", "export_receipts");
        let jwks = self
            .signer
            .as_ref()
            .map(|s| s.public_keys().to_jwks().to_string())
            .unwrap_or_default();
        Ok(ReceiptPage {
            entries,
            next_after,
            jwks,
        })
    }

    /// ListUndeliverableEvents: one page of the webhook events given up, oldest first, with the
    /// outbox's counts. `page_token` is the previous page's `next` (empty for the first page); a
    /// `page_size` of 0 means the default.
    pub async fn undeliverable_events(
        &self,
        page_token: &str,
        page_size: u32,
    ) -> Result<OutboxPage, GateError> {
        let limit = page_limit(page_size)?;
        let after = page_cursor(page_token, |c| c.agent_id.is_empty())?;
        let reply = self
            .timed(
                "list_undeliverable_events",
                self.store
                    .outbox_undeliverable(after.as_ref(), limit as usize),
            )
            .await?;
        let page = reply.result.map_err(GateError::Refused)?;
        telemetry::record_decision("listed");
        tracing::info!(target: AUDIT, count = page.items.len(), decision = "listed",
            "list_undeliverable_events");
        Ok(page)
    }

    /// Counts the unresolved actions of every agent (at most `cap`) and reports them in the
    /// `oncegate_unresolved_actions` gauge: no audit event, it is the gate's own bookkeeping.
    pub async fn count_unresolved(&self, cap: usize) -> Result<usize, GateError> {
        let mut count = 0;
        let mut after = None;
        loop {
            // Not timed or counted as a store call: it is nobody's request, and a store that is
            // down is the health probe's to report (it would also skew the store-error counts).
            let page = self
                .store
                .list_unresolved(None, after.as_ref(), MAX_PAGE as usize)
                .await?
                .result
                .map_err(GateError::Refused)?;
            count += page.items.len();
            match page.next {
                Some(next) if count < cap => after = Some(next),
                _ => break,
            }
        }
        let count = count.min(cap);
        self.metrics.set_unresolved(count);
        Ok(count)
    }

    /// Checks an operator call's action reference, receipt and note against the limits.
    /// An operator's receipt: within the limits, and what it says it is (every client must be
    /// able to replay it: JSON that parses, or UTF-8 text).
    fn check_operator_input(
        &self,
        key: &ActionKey,
        receipt: &[u8],
        format: ReceiptFormat,
        note: &str,
    ) -> Result<(), GateError> {
        self.check_ref(key)?;
        let max = self.policies.limits.max_receipt_bytes;
        request::check_bytes("receipt", receipt.len(), max)?;
        request::check_bytes("note", note.len(), MAX_NOTE_BYTES)?;
        match format {
            ReceiptFormat::Unspecified => Err(GateError::invalid(
                "receipt_format",
                "say what the receipt is, RECEIPT_FORMAT_JSON or RECEIPT_FORMAT_TEXT, so that \
                 every client can replay it",
            )),
            ReceiptFormat::Json => serde_json::from_slice::<serde_json::Value>(receipt)
                .map(drop)
                .map_err(|e| GateError::invalid("receipt", format!("is not JSON: {e}"))),
            ReceiptFormat::Text => std::str::from_utf8(receipt)
                .map(drop)
                .map_err(|e| GateError::invalid("receipt", format!("is not UTF-8 text: {e}"))),
        }
    }
}
