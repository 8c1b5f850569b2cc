//! Receipts read as their writers meant them: an operator's JSON as the value it holds, an
//! operator's text as a string, a worker's as the bytes its client wrote ([`Receipt`]), or as a
//! typed value ([`Replay::json`]). A receipt that cannot be read so is
//! [`ClientError::ReceiptUndecodable`], which names the action and who wrote the receipt.
//!
//! The Rust guard stores the bytes its closure returns, so a worker's receipt (format
//! `UNSPECIFIED`) is this client's to read: [`Receipt::Bytes`], or JSON when asked for a type (what
//! the Python and TypeScript guards write by default).

use std::ops::Deref;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ClientError;
use oncegate_proto as pb;

/// A receipt as its writer meant it.
#[derive(Debug, Clone, PartialEq)]
pub enum Receipt {
    /// An operator's JSON receipt (`--receipt-format json`): the value it holds.
    Json(Value),
    /// An operator's text receipt (`--receipt-format text`).
    Text(String),
    /// A worker's receipt: the bytes its client wrote, in that client's own encoding.
    Bytes(Vec<u8>),
}

/// An action that had already completed: the completion the gate replayed, and the action it
/// completed. It reads as the [`pb::Completion`] it holds (`replay.receipt`, `replay.fencing`).
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The action, as the gate names it.
    pub action: pb::ActionRef,
    /// The original completion.
    pub completion: pb::Completion,
}

impl Deref for Replay {
    type Target = pb::Completion;

    fn deref(&self) -> &pb::Completion {
        &self.completion
    }
}

impl Replay {
    /// The receipt as its writer meant it (see [`decode`]).
    pub fn decoded(&self) -> Result<Receipt, ClientError> {
        decode(&self.action, &self.completion)
    }

    /// The receipt as a `T` (see [`decode_json`]).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        decode_json(&self.action, &self.completion)
    }
}

/// The receipt of `completion` (of `action`) as its writer meant it: JSON → [`Receipt::Json`],
/// text → [`Receipt::Text`], a worker's → [`Receipt::Bytes`]. Fails only when the bytes are not
/// what their format says, which the gate checks when an operator records them.
pub fn decode(action: &pb::ActionRef, completion: &pb::Completion) -> Result<Receipt, ClientError> {
    let bytes = &completion.receipt;
    match completion.receipt_format() {
        pb::ReceiptFormat::Json => serde_json::from_slice(bytes)
            .map(Receipt::Json)
            .map_err(|e| undecodable(action, completion, format!("not JSON: {e}"))),
        pb::ReceiptFormat::Text => String::from_utf8(bytes.clone())
            .map(Receipt::Text)
            .map_err(|e| undecodable(action, completion, format!("not UTF-8 text: {e}"))),
        pb::ReceiptFormat::Unspecified => Ok(Receipt::Bytes(bytes.clone())),
    }
}

/// The receipt of `completion` (of `action`) as a `T`: an operator's JSON value, an operator's
/// text as a JSON string, a worker's bytes parsed as JSON. A receipt that is none of these, or not
/// a `T`, is [`ClientError::ReceiptUndecodable`].
pub fn decode_json<T: DeserializeOwned>(
    action: &pb::ActionRef,
    completion: &pb::Completion,
) -> Result<T, ClientError> {
    let value = match decode(action, completion)? {
        Receipt::Json(value) => value,
        Receipt::Text(text) => Value::String(text),
        Receipt::Bytes(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| undecodable(action, completion, format!("not JSON: {e}")))?,
    };
    serde_json::from_value(value).map_err(|e| {
        let wanted = std::any::type_name::<T>();
        undecodable(action, completion, format!("not a {wanted}: {e}"))
    })
}

fn undecodable(action: &pb::ActionRef, completion: &pb::Completion, reason: String) -> ClientError {
    ClientError::ReceiptUndecodable {
        action: Box::new(action.clone()),
        writer: completion.source(),
        operator: completion.operator.clone(),
        format: completion.receipt_format(),
        fencing: completion.fencing,
        reason,
    }
}

/// Who wrote a receipt and in what, as a person reads it: `operator "ops-alice" as text`, or
/// `a worker (fencing 17) in its client's own encoding`.
pub(crate) fn writer_text(
    writer: pb::CompletionSource,
    operator: &str,
    format: pb::ReceiptFormat,
    fencing: u64,
) -> String {
    match writer {
        pb::CompletionSource::Operator => {
            let what = match format {
                pb::ReceiptFormat::Json => "as JSON",
                pb::ReceiptFormat::Text => "as text",
                pb::ReceiptFormat::Unspecified => "with no format stated",
            };
            format!("operator {operator:?} {what}")
        }
        _ => format!("a worker (fencing {fencing}) in its client's own encoding"),
    }
}

/// An action as a person reads it: `agent "a", run "r", key "k"`.
pub(crate) fn action_text(action: &pb::ActionRef) -> String {
    let scope = action.scope.clone().unwrap_or_default();
    format!(
        "agent {:?}, run {:?}, key {:?}",
        scope.agent_id, scope.run_id, action.key
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action() -> pb::ActionRef {
        pb::ActionRef {
            scope: Some(pb::Scope {
                agent_id: "billing".into(),
                run_id: "run-1".into(),
            }),
            key: "invoice-7".into(),
        }
    }

    fn completion(receipt: &[u8], format: pb::ReceiptFormat) -> pb::Completion {
        let source = match format {
            pb::ReceiptFormat::Unspecified => pb::CompletionSource::Worker,
            _ => pb::CompletionSource::Operator,
        };
        pb::Completion {
            receipt: receipt.to_vec(),
            fencing: 17,
            source: source as i32,
            operator: "ops-alice".into(),
            receipt_format: format as i32,
            ..Default::default()
        }
    }

    #[test]
    fn each_format_reads_as_its_writer_meant() {
        let json = completion(br#"{"tx":7}"#, pb::ReceiptFormat::Json);
        assert_eq!(
            decode(&action(), &json).unwrap(),
            Receipt::Json(serde_json::json!({"tx": 7}))
        );
        let text = completion(b"12345", pb::ReceiptFormat::Text);
        assert_eq!(
            decode(&action(), &text).unwrap(),
            Receipt::Text("12345".into())
        );
        assert_eq!(decode_json::<String>(&action(), &text).unwrap(), "12345");
        let worker = completion(b"\xffraw", pb::ReceiptFormat::Unspecified);
        assert_eq!(
            decode(&action(), &worker).unwrap(),
            Receipt::Bytes(b"\xffraw".to_vec())
        );
    }

    #[test]
    fn an_undecodable_receipt_names_the_action_and_its_writer() {
        let worker = completion(b"\xffraw", pb::ReceiptFormat::Unspecified);
        let shown = decode_json::<Value>(&action(), &worker)
            .unwrap_err()
            .to_string();
        assert!(
            shown.contains(r#"agent "billing", run "run-1", key "invoice-7""#)
                && shown.contains("a worker (fencing 17)")
                && shown.contains("not JSON"),
            "{shown}"
        );
        let operator = completion(b"\xff", pb::ReceiptFormat::Text);
        let shown = decode(&action(), &operator).unwrap_err().to_string();
        assert!(shown.contains(r#"operator "ops-alice" as text"#), "{shown}");
    }
}
