//! Decoding script replies: the one place the reply layouts documented in each script's header
//! (`{ now, tag, ... }`) become Rust values. Knows nothing of connections or decisions.

use redis::Value;

use super::listing;

use crate::{OutboxEntry, StoreError};
use oncegate_domain::{
    ledger::{
        ActionView, Asked, Completion, Grant, GrantKind, Millis, ReceiptFormat, Refusal, Source,
        State,
    },
    ledger::{Approval, ApprovalState, Bucket, Exceeded, Pending},
};

/// What a script said, decoded once.
#[derive(Debug)]
pub(super) enum Decoded {
    Granted {
        grant: Grant,
        kind: GrantKind,
        /// A new grant whose member is the only one in its agent's lease index: the grant opened
        /// the index, which the agents index may then be without (see agents.rs).
        opened: bool,
    },
    Completed {
        completion: Completion,
        recorded: bool,
        double_execution: bool,
        /// Whether the script just appended the completion to its agent's receipt chain (which
        /// then has an entry to seal).
        chained: bool,
    },
    KeyReused(String),
    Released(u64),
    Extended(Millis),
    View(ActionView),
    Refused(Refusal),
    /// unresolved.lua: one entry per member checked.
    Checked(Vec<listing::Checked>),
    /// request_token.lua: held for an operator's approval.
    Pending(Pending),
    /// decide_approval.lua: the approval after the decision, and whether it changed.
    Approval(Approval, bool),
    /// approvals.lua: one entry per member (`None`: lapsed).
    Approvals(Vec<Option<Approval>>),
    /// budgets.lua: every bucket of an agent.
    Budgets(Vec<(String, Bucket)>),
    /// outbox_append.lua: how many entries were written.
    Appended(u32),
    /// outbox_claim.lua and outbox_read.lua: the entries (`None`: absent), pending, undeliverable.
    Outbox(Vec<Option<OutboxEntry>>, u64, u64),
    /// outbox_settle.lua: whether the entry changed.
    OutboxSettled(bool),
}

fn approval_state(n: i64) -> Result<ApprovalState, StoreError> {
    Ok(match n {
        1 => ApprovalState::Pending,
        2 => ApprovalState::Approved,
        3 => ApprovalState::Denied,
        4 => ApprovalState::Used,
        n => return Err(StoreError::corrupt(format!("unknown approval state {n}"))),
    })
}

/// An approval as the scripts pack it (the layout in prelude.lua).
type PackedApproval = (
    String,
    String,
    String,
    i64,
    Millis,
    Millis,
    String,
    String,
    String,
    String,
    String,
    String,
);

/// An approval stored before the params were kept (eleven slots).
type OlderApproval = (
    String,
    String,
    String,
    i64,
    Millis,
    Millis,
    String,
    String,
    String,
    String,
    String,
);

fn approval(bytes: &[u8]) -> Result<Approval, StoreError> {
    let (
        id,
        fingerprint,
        digests,
        state,
        created_at,
        expires_at,
        policy,
        reason,
        action,
        operator,
        note,
        params,
    ): PackedApproval = match rmp_serde::from_slice(bytes) {
        Ok(packed) => packed,
        Err(e) => match rmp_serde::from_slice::<OlderApproval>(bytes) {
            Ok((id, fp, dg, st, cr, ex, po, re, ac, op, no)) => {
                (id, fp, dg, st, cr, ex, po, re, ac, op, no, String::new())
            }
            Err(_) => return Err(StoreError::corrupt_by("approval", e)),
        },
    };
    Ok(Approval {
        id,
        fingerprint,
        digests,
        state: approval_state(state)?,
        created_at,
        expires_at,
        policy,
        reason,
        action,
        operator,
        note,
        params,
    })
}

/// A bucket as the scripts pack it: `{ action, group, { start, amount, ... } }`.
fn bucket(bytes: &[u8]) -> Result<Bucket, StoreError> {
    let (action, group, flat): (String, String, Vec<i64>) =
        rmp_serde::from_slice(bytes).map_err(|e| StoreError::corrupt_by("bucket", e))?;
    let slots = flat
        .chunks_exact(2)
        .map(|pair| (pair[0], pair[1].max(0) as u64))
        .collect();
    Ok(Bucket {
        action,
        group,
        slots,
    })
}

pub(super) fn unexpected(op: &str, decoded: &Decoded) -> StoreError {
    StoreError::corrupt(format!("script {op} answered {decoded:?}"))
}

/// The one place script replies are decoded. Layouts are documented in each script's header. A
/// packed reply (library.rs's `Reply::Packed`) is unpacked first.
pub(super) fn decode(value: Value) -> Result<(Millis, Decoded), StoreError> {
    let value = match value {
        Value::BulkString(packed) => unpacked(&packed)?,
        value => value,
    };
    let Value::Array(items) = value else {
        return Err(StoreError::corrupt(format!(
            "script reply is not an array: {value:?}"
        )));
    };
    let mut fields = Fields { items, next: 0 };
    let now = fields.int()?;
    let tag = fields.string()?;
    let decoded = match tag.as_str() {
        "granted" => {
            let kind = match fields.int()? {
                1 => GrantKind::New,
                2 => GrantKind::Redelivered,
                3 => GrantKind::Regranted,
                n => return Err(StoreError::corrupt(format!("unknown grant kind {n}"))),
            };
            let token = fields.string()?;
            let fencing = fields.uint()?;
            let lease_expires_at = fields.int()?;
            let opened = fields.int()? == 1;
            Decoded::Granted {
                grant: Grant {
                    token,
                    fencing,
                    lease_expires_at,
                },
                kind,
                opened,
            }
        }
        "completed" => {
            let recorded = fields.int()? == 1;
            let double_execution = fields.int()? == 1;
            let completion = fields.completion()?;
            let chained = fields.uint()? > 0;
            Decoded::Completed {
                completion,
                recorded,
                double_execution,
                chained,
            }
        }
        "key_reused" => Decoded::KeyReused(fields.string()?),
        "released" => Decoded::Released(fields.uint()?),
        "extended" => Decoded::Extended(fields.int()?),
        "view" => {
            let state = match fields.int()? {
                1 => State::Absent,
                2 => State::Authorized,
                3 => State::Completed,
                4 => State::Expired,
                n => return Err(StoreError::corrupt(format!("unknown state {n}"))),
            };
            let fencing = fields.uint()?;
            let fingerprint = fields.string()?;
            let lease = fields.int()?;
            let holder = fields.string()?;
            let has_completion = fields.int()? == 1;
            let completion = fields.completion()?;
            let token = fields.string()?;
            let action = fields.string()?;
            let params = fields.string()?;
            Decoded::View(ActionView {
                state,
                fencing,
                fingerprint,
                lease_expires_at: matches!(state, State::Authorized | State::Expired)
                    .then_some(lease),
                completion: has_completion.then_some(completion),
                holder,
                token,
                action,
                params,
            })
        }
        "in_progress" => Decoded::Refused(Refusal::InProgress {
            retry_after: fields.int()?,
        }),
        "lease_expired" => Decoded::Refused(Refusal::LeaseExpired {
            token: fields.string()?,
            fencing: fields.uint()?,
            expired_at: fields.int()?,
        }),
        "token_mismatch" => Decoded::Refused(Refusal::TokenMismatch),
        "token_unknown" => Decoded::Refused(Refusal::TokenUnknown),
        "already_completed" => Decoded::Refused(Refusal::AlreadyCompleted),
        "completed_by_other" => Decoded::Refused(Refusal::CompletedByOther {
            fencing: fields.uint()?,
            completed_at: fields.int()?,
        }),
        "request_required" => Decoded::Refused(Refusal::RequestRequired),
        "pending_approval" => Decoded::Pending(Pending {
            id: fields.string()?,
            expires_at: fields.int()?,
            policy: fields.string()?,
            reason: fields.string()?,
        }),
        "approval_denied" => Decoded::Refused(Refusal::ApprovalDenied {
            id: fields.string()?,
        }),
        "budget_exceeded" => Decoded::Refused(Refusal::BudgetExceeded(Exceeded {
            budget: fields.string()?,
            retry_after: Some(fields.int()?).filter(|ms| *ms >= 0),
            used: fields.int()?.max(0) as u64,
            limit: fields.int()?.max(0) as u64,
            requested: fields.int()?.max(0) as u64,
        })),
        "not_pending" => Decoded::Refused(Refusal::ApprovalNotPending {
            state: match fields.int()? {
                0 => None,
                n => Some(approval_state(n)?),
            },
        }),
        "approval" => {
            let changed = fields.int()? == 1;
            Decoded::Approval(approval(&fields.bytes()?)?, changed)
        }
        "approvals" => {
            let n = fields.uint()?;
            let mut out = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                let raw = fields.bytes()?;
                out.push(if raw.is_empty() {
                    None
                } else {
                    Some(approval(&raw)?)
                });
            }
            Decoded::Approvals(out)
        }
        "budgets" => {
            let n = fields.uint()?;
            let mut out = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                let id = fields.string()?;
                out.push((id, bucket(&fields.bytes()?)?));
            }
            Decoded::Budgets(out)
        }
        "not_expired" => Decoded::Refused(Refusal::NotExpired {
            state: match fields.int()? {
                1 => State::Absent,
                2 => State::Authorized,
                n => return Err(StoreError::corrupt(format!("unknown state {n}"))),
            },
        }),
        "already_settled" => Decoded::Refused(Refusal::AlreadySettled {
            state: match fields.int()? {
                1 => State::Absent,
                2 => State::Authorized,
                4 => State::Expired,
                n => return Err(StoreError::corrupt(format!("unknown state {n}"))),
            },
            fencing: fields.uint()?,
        }),
        "unresolved" => {
            let n = fields.uint()?;
            let mut checked = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                let status = fields.int()?;
                let fencing = fields.uint()?;
                let fingerprint = fields.string()?;
                let lease_expires_at = fields.int()?;
                let holder = fields.string()?;
                let token = fields.string()?;
                let asked = Asked {
                    action: fields.string()?,
                    params: fields.string()?,
                };
                let (action, params) = (asked.action.clone(), asked.params.clone());
                checked.push(match status {
                    0 => listing::Checked::Stale,
                    1 => listing::Checked::Unresolved(Box::new((
                        ActionView {
                            state: State::Expired,
                            fencing,
                            fingerprint,
                            lease_expires_at: Some(lease_expires_at),
                            completion: None,
                            holder,
                            token,
                            action,
                            params,
                        },
                        asked,
                    ))),
                    2 => listing::Checked::Live,
                    n => return Err(StoreError::corrupt(format!("unknown list status {n}"))),
                });
            }
            Decoded::Checked(checked)
        }
        "appended" => Decoded::Appended(fields.uint()? as u32),
        "outbox_settled" => Decoded::OutboxSettled(fields.int()? == 1),
        "claimed" | "outbox_read" => {
            let (pending, undeliverable, n) = (fields.uint()?, fields.uint()?, fields.uint()?);
            let mut entries = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                let raw = fields.bytes()?;
                entries.push(match raw.is_empty() {
                    true => None,
                    false => Some(OutboxEntry::decode(&raw)?),
                });
            }
            Decoded::Outbox(entries, pending, undeliverable)
        }
        other => {
            return Err(StoreError::corrupt(format!(
                "unknown script reply tag {other:?}"
            )));
        }
    };
    Ok((now, decoded))
}

/// What a function's packed reply (`cmsgpack.pack` of a Lua table) unpacks to: the value Redis
/// itself would have made of that table. A string is a bulk string; a number an integer,
/// truncated toward zero; `true` 1; `false` nil; a table the array of its items 1, 2, … up to
/// the first missing one (cmsgpack writes a table with holes or other keys as a map).
pub fn unpacked(mut packed: &[u8]) -> Result<Value, StoreError> {
    let value = lua_value(&mut packed, 0)?;
    if !packed.is_empty() {
        return Err(StoreError::corrupt(format!(
            "packed script reply: {} bytes after its value",
            packed.len()
        )));
    }
    Ok(value)
}

/// How deep a packed reply may nest (cmsgpack itself writes nil below 16 levels).
const MAX_DEPTH: usize = 16;

/// The next `n` bytes of a packed reply.
fn take<'a>(rd: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
    if rd.len() < n {
        return Err(StoreError::corrupt("packed script reply: truncated"));
    }
    let (taken, rest) = rd.split_at(n);
    *rd = rest;
    Ok(taken)
}

/// The next `N` bytes (a big-endian number).
fn be<const N: usize>(rd: &mut &[u8]) -> Result<[u8; N], StoreError> {
    Ok(take(rd, N)?.try_into().expect("N bytes"))
}

/// A length of `N` big-endian bytes.
fn len<const N: usize>(rd: &mut &[u8]) -> Result<usize, StoreError> {
    Ok(be::<N>(rd)?
        .iter()
        .fold(0usize, |n, b| n << 8 | usize::from(*b)))
}

/// One value of a packed reply, `depth` tables deep.
fn lua_value(rd: &mut &[u8], depth: usize) -> Result<Value, StoreError> {
    use rmp::Marker;
    if depth > MAX_DEPTH {
        return Err(StoreError::corrupt("packed script reply: nested too deep"));
    }
    let marker = Marker::from_u8(take(rd, 1)?[0]);
    // Strings, arrays and maps: their length, then what follows it.
    enum Sized {
        Bytes,
        Array,
        Map,
    }
    let (sized, n) = match marker {
        Marker::FixStr(n) => (Sized::Bytes, n.into()),
        Marker::Str8 | Marker::Bin8 => (Sized::Bytes, len::<1>(rd)?),
        Marker::Str16 | Marker::Bin16 => (Sized::Bytes, len::<2>(rd)?),
        Marker::Str32 | Marker::Bin32 => (Sized::Bytes, len::<4>(rd)?),
        Marker::FixArray(n) => (Sized::Array, n.into()),
        Marker::Array16 => (Sized::Array, len::<2>(rd)?),
        Marker::Array32 => (Sized::Array, len::<4>(rd)?),
        Marker::FixMap(n) => (Sized::Map, n.into()),
        Marker::Map16 => (Sized::Map, len::<2>(rd)?),
        Marker::Map32 => (Sized::Map, len::<4>(rd)?),
        scalar => return scalar_value(scalar, rd),
    };
    match sized {
        Sized::Bytes => Ok(Value::BulkString(take(rd, n)?.to_vec())),
        Sized::Array => items(rd, n, depth),
        Sized::Map => pairs(rd, n, depth),
    }
}

/// A number, a boolean or nil, as Redis turns the Lua value into RESP.
fn scalar_value(marker: rmp::Marker, rd: &mut &[u8]) -> Result<Value, StoreError> {
    use rmp::Marker;
    let float = |f: f64| Value::Int(f.trunc() as i64);
    Ok(match marker {
        Marker::FixPos(n) => Value::Int(n.into()),
        Marker::FixNeg(n) => Value::Int(n.into()),
        Marker::U8 => Value::Int(be::<1>(rd)?[0].into()),
        Marker::U16 => Value::Int(u16::from_be_bytes(be(rd)?).into()),
        Marker::U32 => Value::Int(u32::from_be_bytes(be(rd)?).into()),
        Marker::U64 => {
            let n = u64::from_be_bytes(be(rd)?);
            Value::Int(i64::try_from(n).map_err(|_| {
                StoreError::corrupt(format!("packed script reply: integer {n} out of range"))
            })?)
        }
        Marker::I8 => Value::Int(i8::from_be_bytes(be(rd)?).into()),
        Marker::I16 => Value::Int(i16::from_be_bytes(be(rd)?).into()),
        Marker::I32 => Value::Int(i32::from_be_bytes(be(rd)?).into()),
        Marker::I64 => Value::Int(i64::from_be_bytes(be(rd)?)),
        Marker::F32 => float(f32::from_be_bytes(be(rd)?).into()),
        Marker::F64 => float(f64::from_be_bytes(be(rd)?)),
        Marker::True => Value::Int(1),
        Marker::False | Marker::Null => Value::Nil,
        other => {
            return Err(StoreError::corrupt(format!(
                "packed script reply: unexpected {other:?}"
            )));
        }
    })
}

/// A packed array of `n` items.
fn items(rd: &mut &[u8], n: usize, depth: usize) -> Result<Value, StoreError> {
    // Every item takes a byte at least: a length beyond the bytes left is corrupt, not an
    // allocation to make.
    let mut items = Vec::with_capacity(n.min(rd.len()));
    for _ in 0..n {
        items.push(lua_value(rd, depth + 1)?);
    }
    Ok(Value::Array(items))
}

/// A packed map of `n` pairs: a Lua table that is not a sequence, of which Redis keeps the items
/// at 1, 2, … up to the first missing one.
fn pairs(rd: &mut &[u8], n: usize, depth: usize) -> Result<Value, StoreError> {
    let mut by_index = std::collections::BTreeMap::new();
    for _ in 0..n {
        let key = lua_value(rd, depth + 1)?;
        let value = lua_value(rd, depth + 1)?;
        if let Value::Int(i) = key {
            by_index.insert(i, value);
        }
    }
    let mut items = Vec::new();
    while let Some(value) = by_index.remove(&(items.len() as i64 + 1)) {
        items.push(value);
    }
    Ok(Value::Array(items))
}

/// A cursor over a script's reply array.
struct Fields {
    items: Vec<Value>,
    next: usize,
}

impl Fields {
    fn take(&mut self) -> Result<Value, StoreError> {
        let value = self
            .items
            .get_mut(self.next)
            .map(|v| std::mem::replace(v, Value::Nil))
            .ok_or_else(|| {
                StoreError::corrupt(format!("script reply too short (field {})", self.next))
            })?;
        self.next += 1;
        Ok(value)
    }

    fn int(&mut self) -> Result<i64, StoreError> {
        match self.take()? {
            Value::Int(n) => Ok(n),
            other => Err(StoreError::corrupt(format!(
                "expected an integer, got {other:?}"
            ))),
        }
    }

    fn uint(&mut self) -> Result<u64, StoreError> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| StoreError::corrupt(format!("negative counter {n}")))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.take()? {
            Value::BulkString(bytes) => Ok(bytes),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            other => Err(StoreError::corrupt(format!(
                "expected a string, got {other:?}"
            ))),
        }
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|e| StoreError::corrupt_by("non-UTF-8 text", e))
    }

    fn completion(&mut self) -> Result<Completion, StoreError> {
        let receipt = self.bytes()?;
        let completed_at = self.int()?;
        let fencing = self.uint()?;
        let token = self.string()?;
        let source = match self.int()? {
            2 => Source::Operator,
            _ => Source::Worker,
        };
        let note = self.string()?;
        let operator = self.string()?;
        let seq = self.uint()?;
        let statement = self.string()?;
        let format = match self.int()? {
            1 => ReceiptFormat::Json,
            2 => ReceiptFormat::Text,
            _ => ReceiptFormat::Unspecified,
        };
        Ok(Completion {
            receipt,
            completed_at,
            fencing,
            token,
            source,
            note,
            operator,
            seq,
            statement,
            format,
        })
    }
}
