//! `oncegate admin audit --agent X`: reads every page of the agent's receipt chain
//! (ExportReceipts) and verifies it with [`oncegate_domain::statement::receipt::verify_chain`]:
//! every head's signature, the sequence, every entry's digest against the head that covers it.
//! The verdict is a JSON document; a chain that does not hold names each entry that breaks it, and
//! entries after the last signed head are listed as unsigned yet (not as problems).

use serde_json::{Value, json};
use tonic::Status;

use super::AuditArgs;
use oncegate_domain::statement::{
    PublicKeys,
    receipt::{ChainEntry, FIRST_PREV, ReceiptCore, verify_chain},
};
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

/// Exports and verifies the chain; the value says `"intact": true` or lists the problems.
pub(super) async fn run<T>(
    admin: &mut GateAdminServiceClient<T>,
    args: &AuditArgs,
) -> Result<Value, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut entries = Vec::new();
    let mut after = 0;
    let mut served_jwks;
    loop {
        let page = admin
            .export_receipts(pb::ExportReceiptsRequest {
                agent_id: args.agent.clone(),
                after_seq: after,
                page_size: 1000,
            })
            .await?
            .into_inner();
        served_jwks = page.jwks;
        entries.extend(page.entries.into_iter().map(entry));
        match page.next_after_seq {
            0 => break,
            next => after = next,
        }
    }
    let (jwks, source) = match &args.keys {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| Status::invalid_argument(format!("--keys {}: {e}", path.display())))?,
            path.display().to_string(),
        ),
        None => (served_jwks, "served by the gate".to_owned()),
    };
    let keys = PublicKeys::from_jwks(&jwks)
        .map_err(|e| Status::invalid_argument(format!("the keys ({source}): {e}")))?;
    let report = verify_chain(&keys, &args.agent, &entries);
    let head = head(&entries);
    Ok(json!({
        "agent": args.agent,
        "entries": entries.len(),
        "verified": report.verified,
        "unsigned_yet": report.unsigned,
        "intact": report.problems.is_empty(),
        "problems": report.problems.iter().map(|p| json!({"seq": p.seq, "key": p.key, "what": p.what})).collect::<Vec<_>>(),
        "head": head,
        "keys": source,
    }))
}

/// The last entry and its digest, recomputed along the stored chain (what the next entry's `prev`
/// must name).
fn head(entries: &[ChainEntry]) -> Option<Value> {
    let mut digest = FIRST_PREV.to_owned();
    for e in entries {
        digest = e.core.digest(&digest);
    }
    entries
        .last()
        .map(|e| json!({"seq": e.core.seq, "digest": digest}))
}

fn entry(e: pb::ReceiptEntry) -> ChainEntry {
    let source = match e.source() {
        pb::CompletionSource::Operator => "operator",
        _ => "worker",
    };
    let action = e.action.unwrap_or_default();
    let scope = action.scope.unwrap_or_default();
    let completed_at = e
        .completed_at
        .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000);
    ChainEntry {
        core: ReceiptCore {
            seq: e.seq,
            agent: scope.agent_id,
            run: scope.run_id,
            key: action.key,
            fingerprint: e.fingerprint,
            receipt_digest: e.receipt_digest,
            fencing: e.fencing,
            source: source.into(),
            completed_at,
        },
        statement: e.statement,
    }
}

/// The verdict for a person.
pub(super) fn human(value: &Value) -> String {
    let unsigned: Vec<u64> = value["unsigned_yet"]
        .as_array()
        .map(|seqs| seqs.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let unsigned = match (unsigned.first(), unsigned.last()) {
        (Some(first), Some(last)) => format!(
            "{} unsigned yet (entries {first}-{last}, after the last signed head)",
            unsigned.len()
        ),
        _ => "0 unsigned yet".to_owned(),
    };
    let mut out = format!(
        "agent {}: {} entries, {} verified, {unsigned}; keys {}\n",
        value["agent"].as_str().unwrap_or_default(),
        value["entries"],
        value["verified"],
        value["keys"].as_str().unwrap_or_default(),
    );
    if let Some(head) = value["head"].as_object() {
        out.push_str(&format!(
            "head: entry {} digest {}\n",
            head["seq"],
            head["digest"].as_str().unwrap_or_default()
        ));
    }
    match value["problems"].as_array() {
        Some(problems) if !problems.is_empty() => {
            for p in problems {
                out.push_str(&format!(
                    "BROKEN entry {} (key {}): {}\n",
                    p["seq"],
                    p["key"],
                    p["what"].as_str().unwrap_or_default()
                ));
            }
        }
        _ => out.push_str("intact: no completion removed or rewritten\n"),
    }
    out
}
