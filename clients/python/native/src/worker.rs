//! The guard's hot worker RPCs with plain values: RequestToken, Complete, Release and
//! ExtendLease take their fields as Python strings and numbers, the request is built and the
//! answer read here with the workspace's generated messages (`oncegate-proto`), and the answer
//! comes back as tuples of plain values (`oncegate/native.py` makes the models of them). No
//! Python protobuf object is made on the way, which was about as much of a guarded cycle's CPU
//! as the call itself.
//!
//! Each function blocks (the GIL released) when `done` is `None`, and otherwise starts the call
//! on the background runtime and returns a [`Call`](crate::channel::Call), `done` then receiving the tuple or the
//! exception, as `Channel.start` does with bytes. What a failed call raises is the channel's
//! factory's, as for every call. Decides nothing: the fields are the caller's, the answer is
//! what the gate said.

use bytes::Bytes;
use oncegate_proto as pb;
use prost::Message;
use pyo3::{
    IntoPyObjectExt,
    exceptions::PyValueError,
    prelude::*,
    types::{PyBytes, PyTuple},
};

use crate::{
    channel::Channel,
    wire::{COMPLETE, EXTEND_LEASE, RELEASE, REQUEST_TOKEN},
};

/// RequestToken. Answers `(decision, agent_id, run_id, key, fingerprint, grant, completion,
/// redelivered, approval)`, where `grant` is `(token, fencing, lease_expires_at, provider_key,
/// statement)`, `completion` as [`complete`] answers it and `approval` is `(id, expires_at,
/// policy_id, reason)`, each `None` when the answer has none; a time is `(seconds, nanos)` or
/// `None`. `lease_ttl` is in nanoseconds (the policy's when `None`); empty strings are unset
/// fields.
#[pyfunction]
#[pyo3(signature = (channel, action, params_json, agent_id, run_id, intent_id, idempotency_key, holder, lease_ttl, timeout, metadata, done=None))]
#[allow(clippy::too_many_arguments)]
pub fn request_token(
    py: Python<'_>,
    channel: &Bound<'_, Channel>,
    action: String,
    params_json: String,
    agent_id: String,
    run_id: String,
    intent_id: String,
    idempotency_key: String,
    holder: String,
    lease_ttl: Option<i64>,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    done: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let request = pb::RequestTokenRequest {
        scope: Some(pb::Scope { agent_id, run_id }),
        action,
        params_json,
        intent_id,
        idempotency_key,
        holder,
        lease_ttl: lease_ttl.map(duration),
    };
    unary(
        py,
        channel.get(),
        REQUEST_TOKEN,
        &request,
        timeout,
        metadata,
        done,
        request_token_answer,
    )
}

/// Complete. Answers the stored completion, `(receipt, completed_at, fencing, token, source,
/// operator, receipt_format)` (an empty one when the answer holds none, as protobuf reads an
/// unset field).
#[pyfunction]
#[pyo3(signature = (channel, agent_id, run_id, key, token, receipt, timeout, metadata, done=None))]
#[allow(clippy::too_many_arguments)]
pub fn complete(
    py: Python<'_>,
    channel: &Bound<'_, Channel>,
    agent_id: String,
    run_id: String,
    key: String,
    token: String,
    receipt: Vec<u8>,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    done: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let request = pb::CompleteRequest {
        action: Some(action_ref(agent_id, run_id, key)),
        token,
        receipt,
    };
    unary(
        py,
        channel.get(),
        COMPLETE,
        &request,
        timeout,
        metadata,
        done,
        |py, bytes| {
            let answer = decode::<pb::CompleteResponse>(bytes)?;
            completion(py, answer.completion.unwrap_or_default())
        },
    )
}

/// Release with `reason` (the `ReleaseReason` number). Answers the released grant's fencing.
#[pyfunction]
#[pyo3(signature = (channel, agent_id, run_id, key, token, reason, timeout, metadata, done=None))]
#[allow(clippy::too_many_arguments)]
pub fn release(
    py: Python<'_>,
    channel: &Bound<'_, Channel>,
    agent_id: String,
    run_id: String,
    key: String,
    token: String,
    reason: i32,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    done: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let request = pb::ReleaseRequest {
        action: Some(action_ref(agent_id, run_id, key)),
        token,
        reason,
    };
    unary(
        py,
        channel.get(),
        RELEASE,
        &request,
        timeout,
        metadata,
        done,
        |py, bytes| {
            decode::<pb::ReleaseResponse>(bytes)?
                .fencing
                .into_py_any(py)
        },
    )
}

/// ExtendLease by `ttl` nanoseconds. Answers the new lease end, `(seconds, nanos)` or `None`.
#[pyfunction]
#[pyo3(signature = (channel, agent_id, run_id, key, token, ttl, timeout, metadata, done=None))]
#[allow(clippy::too_many_arguments)]
pub fn extend_lease(
    py: Python<'_>,
    channel: &Bound<'_, Channel>,
    agent_id: String,
    run_id: String,
    key: String,
    token: String,
    ttl: i64,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    done: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let request = pb::ExtendLeaseRequest {
        action: Some(action_ref(agent_id, run_id, key)),
        token,
        ttl: Some(duration(ttl)),
    };
    unary(
        py,
        channel.get(),
        EXTEND_LEASE,
        &request,
        timeout,
        metadata,
        done,
        |py, bytes| {
            time(
                py,
                decode::<pb::ExtendLeaseResponse>(bytes)?.lease_expires_at,
            )
        },
    )
}

/// Sends `request` to `path`: blocks and answers what `answer` makes of the response, or, with
/// `done`, starts the call and answers its [`Call`](crate::channel::Call).
#[allow(clippy::too_many_arguments)]
fn unary(
    py: Python<'_>,
    channel: &Channel,
    path: &str,
    request: &impl Message,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    done: Option<Py<PyAny>>,
    answer: fn(Python<'_>, Bytes) -> PyResult<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let call = channel.prepare(
        path,
        Bytes::from(request.encode_to_vec()),
        timeout,
        metadata,
    )?;
    match done {
        None => answer(py, channel.block(py, call)?),
        Some(done) => channel.spawn(py, call, done, answer)?.into_py_any(py),
    }
}

pub(crate) fn decode<M: Message + Default>(bytes: Bytes) -> PyResult<M> {
    M::decode(bytes).map_err(|e| PyValueError::new_err(format!("the gate's answer: {e}")))
}

fn action_ref(agent_id: String, run_id: String, key: String) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope { agent_id, run_id }),
        key,
    }
}

/// A duration of `nanos` nanoseconds, seconds and nanos of the same sign (as protobuf's
/// `Duration.FromNanoseconds` makes it).
pub(crate) fn duration(nanos: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: nanos / 1_000_000_000,
        // The remainder's magnitude is below 10^9: it fits.
        nanos: i32::try_from(nanos % 1_000_000_000).unwrap_or_default(),
    }
}

pub(crate) fn request_token_answer(py: Python<'_>, bytes: Bytes) -> PyResult<Py<PyAny>> {
    let answer = decode::<pb::RequestTokenResponse>(bytes)?;
    let action = answer.action.unwrap_or_default();
    let scope = action.scope.unwrap_or_default();
    let grant = optional(py, answer.grant, |py, grant| {
        tuple(
            py,
            (
                grant.token,
                grant.fencing,
                time(py, grant.lease_expires_at)?,
                grant.provider_key,
                grant.statement,
            ),
        )
    })?;
    let approval = optional(py, answer.approval, |py, approval| {
        tuple(
            py,
            (
                approval.id,
                time(py, approval.expires_at)?,
                approval.policy_id,
                approval.reason,
            ),
        )
    })?;
    tuple(
        py,
        (
            answer.decision,
            scope.agent_id,
            scope.run_id,
            action.key,
            answer.fingerprint,
            grant,
            optional(py, answer.completion, completion)?,
            answer.redelivered,
            approval,
        ),
    )
}

fn completion(py: Python<'_>, completion: pb::Completion) -> PyResult<Py<PyAny>> {
    tuple(
        py,
        (
            PyBytes::new(py, &completion.receipt),
            time(py, completion.completed_at)?,
            completion.fencing,
            completion.token,
            completion.source,
            completion.operator,
            completion.receipt_format,
        ),
    )
}

fn optional<T>(
    py: Python<'_>,
    value: Option<T>,
    convert: fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    value.map_or_else(|| Ok(py.None()), |value| convert(py, value))
}

fn time(py: Python<'_>, stamp: Option<prost_types::Timestamp>) -> PyResult<Py<PyAny>> {
    optional(py, stamp, |py, stamp| {
        tuple(py, (stamp.seconds, stamp.nanos))
    })
}

fn tuple<'py, T>(py: Python<'py>, values: T) -> PyResult<Py<PyAny>>
where
    T: IntoPyObject<'py, Target = PyTuple, Output = Bound<'py, PyTuple>>,
    PyErr: From<T::Error>,
{
    Ok(values.into_pyobject(py)?.into_any().unbind())
}
