//! The threaded guard's common case as one native call: ask for a token, run the function with
//! its grant while the lease is extended ([`crate::heartbeat`]), encode its result, Complete, and
//! answer the result. Every Python object the common case does not need (the answer's models, an
//! attempt, the completion) is not made.
//!
//! It decides nothing the Python guard does not: anything but the common case hands back to it
//! (`oncegate/guard/runner.py`) with what happened so far, and it carries on from there exactly as
//! `Attempt` would have: a decision other than a grant, a failed RequestToken, a function that
//! raised, a result that could not be encoded, a failed Complete. The heartbeat is stopped
//! before any of them is handed back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use oncegate_proto as pb;
use prost::Message;
use pyo3::{
    exceptions::PyValueError,
    intern,
    prelude::*,
    types::{PyDict, PyTuple},
};

use crate::{
    channel::Channel,
    heartbeat, json,
    wire::{COMPLETE, REQUEST_TOKEN},
    worker,
};

/// How [`Guard::run`] ended: the first item of the tuple it answers.
mod ended {
    /// `(DONE, result)`: completed; the function's result.
    pub const DONE: u8 = 0;
    /// `(ANSWERED, answer)`: the gate did not grant (a replay, an approval to wait for); `answer`
    /// as `request_token` answers it.
    pub const ANSWERED: u8 = 1;
    /// `(ASK_FAILED, error)`: RequestToken failed; `error` as the channel's factory made it.
    pub const ASK_FAILED: u8 = 2;
    /// `(RAISED, answer, grant, error)`: the function raised `error`.
    pub const RAISED: u8 = 3;
    /// `(UNENCODED, answer, grant, result, error)`: `encode(result)` raised `error`.
    pub const UNENCODED: u8 = 4;
    /// `(UNACKNOWLEDGED, answer, grant, result, receipt, error)`: Complete failed with `error`.
    pub const UNACKNOWLEDGED: u8 = 5;
}

/// One decorated function's guard on the native core: what stays the same from call to call.
///
/// `Guard(action, lease_ttl, heartbeat, metadata, encode, json_receipts, grant_class, epoch,
/// heartbeat_failed)`: `lease_ttl` in nanoseconds (the policy's when `None`), `heartbeat` whether
/// to extend leases, `metadata` every call's headers, `encode(result) -> bytes` the receipt's
/// encoder (`json_receipts` when it is `oncegate.models.json_encode`, which [`json`] writes
/// natively for the values it knows), `grant_class` the `Grant` model (made without its `__init__`, as
/// `oncegate.native` makes the models), `epoch` the aware UTC datetime of the Unix epoch, and
/// `heartbeat_failed(key, error) -> bool` whether to keep extending after a failed extension.
#[pyclass(frozen, module = "oncegate._native")]
pub struct Guard {
    action: String,
    lease_ttl: Option<i64>,
    heartbeat: bool,
    metadata: Vec<(String, String)>,
    encode: Py<PyAny>,
    /// `encode` is the guard's default JSON encoder, which [`json`] writes for the common values.
    json_receipts: bool,
    grant_class: Py<PyAny>,
    epoch: Py<PyAny>,
    heartbeat_failed: Py<PyAny>,
    /// `datetime.timedelta` and `object.__new__`, looked up once (pyo3's `PyDelta` imports the
    /// module on each use under the stable ABI; a lookup on the class per call costs as much).
    timedelta: Py<PyAny>,
    new_object: Py<PyAny>,
}

#[pymethods]
impl Guard {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        action: String,
        lease_ttl: Option<i64>,
        heartbeat: bool,
        metadata: Vec<(String, String)>,
        encode: Py<PyAny>,
        json_receipts: bool,
        grant_class: Py<PyAny>,
        epoch: Py<PyAny>,
        heartbeat_failed: Py<PyAny>,
    ) -> PyResult<Self> {
        if lease_ttl.is_some_and(|ttl| ttl <= 0) {
            return Err(PyValueError::new_err("lease_ttl must be positive"));
        }
        Ok(Guard {
            action,
            lease_ttl,
            heartbeat,
            metadata,
            encode,
            json_receipts,
            grant_class,
            epoch,
            heartbeat_failed,
            timedelta: py.import("datetime")?.getattr("timedelta")?.unbind(),
            new_object: py
                .import("builtins")?
                .getattr("object")?
                .getattr("__new__")?
                .unbind(),
        })
    }

    /// One guarded call through `channel`, each RPC within `timeout` seconds. The function runs as `function(**arguments,
    /// grant=grant)` (`grant=` only when `takes_grant`), or as `function(grant)` when `arguments`
    /// is `None`. Answers a tuple whose first item says how it ended (see `ended` in guard.rs:
    /// 0 done, 1 answered without a grant, 2 RequestToken failed, 3 the function raised, 4 its
    /// result could not be encoded, 5 Complete failed). Empty strings are unset fields.
    #[pyo3(signature = (channel, timeout, params_json, agent_id, run_id, intent_id, idempotency_key, holder, function, arguments, takes_grant))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        channel: &Bound<'py, Channel>,
        timeout: Option<f64>,
        params_json: String,
        agent_id: String,
        run_id: String,
        intent_id: String,
        idempotency_key: String,
        holder: String,
        function: &Bound<'py, PyAny>,
        arguments: Option<&Bound<'py, PyDict>>,
        takes_grant: bool,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let request = pb::RequestTokenRequest {
            scope: Some(pb::Scope { agent_id, run_id }),
            action: self.action.clone(),
            params_json,
            intent_id,
            idempotency_key,
            holder,
            lease_ttl: self.lease_ttl.map(worker::duration),
        };
        let gate = channel.get();
        let call = gate.prepare(
            REQUEST_TOKEN,
            Bytes::from(request.encode_to_vec()),
            timeout,
            self.metadata.clone(),
        )?;
        let answered = match gate.block(py, call) {
            Ok(answered) => answered,
            Err(err) => return (ended::ASK_FAILED, err.into_value(py)).into_pyobject(py),
        };
        let answer = worker::decode::<pb::RequestTokenResponse>(answered.clone())?;
        let granted = answer.decision == pb::Decision::Granted as i32;
        let (Some(grant), true) = (answer.grant, granted) else {
            let answer = worker::request_token_answer(py, answered)?;
            return (ended::ANSWERED, answer).into_pyobject(py);
        };
        let action = answer.action.unwrap_or_default();
        let scope = action.scope.unwrap_or_default();
        let lease = self.lease(&grant).filter(|_| self.heartbeat).map(|ttl| {
            heartbeat::start(
                py,
                channel.clone().unbind(),
                heartbeat::Grant {
                    agent_id: scope.agent_id.clone(),
                    run_id: scope.run_id.clone(),
                    key: action.key.clone(),
                    token: grant.token.clone(),
                    ttl,
                },
                timeout,
                self.metadata.clone(),
                self.heartbeat_failed.clone_ref(py),
            )
        });
        let stop = || {
            if let Some(lease) = &lease {
                lease.stop();
            }
        };
        let token = grant.token.clone();
        let grant = if takes_grant || arguments.is_none() {
            self.grant(py, grant)?
        } else {
            py.None().into_bound(py)
        };
        let answer = || worker::request_token_answer(py, answered.clone());
        let ran = match arguments {
            None => function.call1((&grant,)),
            Some(arguments) if takes_grant => {
                let keywords = arguments.copy()?;
                keywords.set_item(intern!(py, "grant"), &grant)?;
                function.call((), Some(&keywords))
            }
            Some(arguments) => function.call((), Some(arguments)),
        };
        stop();
        let result = match ran {
            Ok(result) => result,
            Err(err) => {
                return (ended::RAISED, answer()?, grant, err.into_value(py)).into_pyobject(py);
            }
        };
        let native = if self.json_receipts {
            json::encode(&result)
        } else {
            None
        };
        let receipt = match native.map_or_else(
            || {
                self.encode
                    .bind(py)
                    .call1((&result,))
                    .and_then(|receipt| receipt.extract::<Vec<u8>>())
            },
            Ok,
        ) {
            Ok(receipt) => receipt,
            Err(err) => {
                return (
                    ended::UNENCODED,
                    answer()?,
                    grant,
                    result,
                    err.into_value(py),
                )
                    .into_pyobject(py);
            }
        };
        let request = pb::CompleteRequest {
            action: Some(pb::ActionRef {
                scope: Some(scope),
                key: action.key,
            }),
            token,
            receipt,
        };
        let call = gate.prepare(
            COMPLETE,
            Bytes::from(request.encode_to_vec()),
            timeout,
            self.metadata.clone(),
        )?;
        match gate
            .block(py, call)
            .and_then(worker::decode::<pb::CompleteResponse>)
        {
            Ok(_) => (ended::DONE, result).into_pyobject(py),
            Err(err) => {
                let receipt = pyo3::types::PyBytes::new(py, &request.receipt);
                (
                    ended::UNACKNOWLEDGED,
                    answer()?,
                    grant,
                    result,
                    receipt,
                    err.into_value(py),
                )
                    .into_pyobject(py)
            }
        }
    }
}

impl Guard {
    /// The lease the heartbeat keeps extending: the one asked for, else what is left of the one
    /// granted (at least a second); `None` when the grant has no lease end.
    fn lease(&self, grant: &pb::Grant) -> Option<Duration> {
        if let Some(ttl) = self.lease_ttl {
            return Some(Duration::from_nanos(u64::try_from(ttl).unwrap_or(0)));
        }
        let ends = grant.lease_expires_at.as_ref()?;
        let ends = UNIX_EPOCH
            + Duration::new(
                u64::try_from(ends.seconds).unwrap_or(0),
                u32::try_from(ends.nanos).unwrap_or(0),
            );
        let left = ends
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Some(left.max(Duration::from_secs(1)))
    }

    /// The `Grant` model of `grant`, equal to what `oncegate.native` makes of the same answer.
    fn grant<'py>(&self, py: Python<'py>, grant: pb::Grant) -> PyResult<Bound<'py, PyAny>> {
        let made = self
            .new_object
            .bind(py)
            .call1((self.grant_class.bind(py),))?;
        let lease_expires_at = match grant.lease_expires_at {
            None => py.None().into_bound(py),
            Some(stamp) => {
                // As `oncegate.native._time` reads it: the epoch plus whole microseconds.
                let delta =
                    self.timedelta
                        .bind(py)
                        .call1((0, stamp.seconds, stamp.nanos / 1000))?;
                self.epoch.bind(py).add(delta)?
            }
        };
        let fields = made.getattr(intern!(py, "__dict__"))?;
        let fields = fields.cast::<PyDict>()?;
        fields.set_item(intern!(py, "token"), grant.token)?;
        fields.set_item(intern!(py, "fencing"), grant.fencing)?;
        fields.set_item(intern!(py, "lease_expires_at"), lease_expires_at)?;
        fields.set_item(intern!(py, "provider_key"), grant.provider_key)?;
        fields.set_item(intern!(py, "statement"), grant.statement)?;
        Ok(made)
    }
}
