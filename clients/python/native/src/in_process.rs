//! Calls to a gate that runs in this process (`oncegate.local`): a channel whose address is a
//! [`crate::local::LocalServer`]'s sends its calls to that server's gate service directly
//! ([`oncegate_server::InProcess`]) instead of through loopback TCP and HTTP/2. The service is the
//! listener's (the same authenticator, limits, audit lines and metrics), so the answers and the
//! errors are the ones the socket would have carried; what is saved is the socket, the framing
//! and a thread of the gate's waking for each call.
//!
//! A call runs as a task on the gate's runtime, where the gate's own tasks (its store's
//! connection among them) live, and the caller waits for it. A blocking caller on Redis runs its
//! call itself instead, over a connection of the route's own ([`Route::block`]): a thread that
//! waits anyway does the work, and Redis's reply wakes it directly. That connection's own tasks
//! (reconnecting, following a Sentinel failover, the seals and agents-index writes its calls
//! start) run on the same runtime: while a caller waits, or when its idle driver wakes (every
//! 200 ms, [`crate::runtime`]).
//!
//! A call past its deadline ends `DEADLINE_EXCEEDED`, as on the listener: its `grpc-timeout`
//! travels with it, and the gate service's own layer ends it there, with the listener's answer. A
//! call whose caller stopped waiting (an asyncio caller that cancelled) is dropped. Stopping waits
//! for the calls in flight, as the listener's drain does; a call after it goes to the listener's
//! address, where nobody answers (`UNAVAILABLE`) unless a gate was started there again. A forked
//! child does not call the parent's gate this way (the gate's threads are not in the child): its
//! channels connect to the parent's listener over TCP.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use oncegate_server::InProcess;
use tokio::{
    runtime::{Handle, Runtime},
    task::AbortHandle,
};
use tokio_util::task::TaskTracker;
use tonic::{Status, body::Body};

use crate::{runtime, wire};

/// The gate of one [`crate::local::LocalServer`], for the channels of this process.
pub struct Route {
    /// `None` once the gate stopped: a call from then on is refused, and the route (which
    /// channels keep) no longer holds the gate, so its store can close.
    service: Mutex<Option<InProcess>>,
    /// On Redis, the same service over a connection of its own, opened on the runtime that
    /// blocking callers drive ([`runtime::Mode::Blocking`]): a thread waiting for a call then
    /// runs it, Redis's I/O included, on its own, and no thread of the gate's wakes for it.
    /// `None` on the embedded store (and once the gate stopped).
    direct: Mutex<Option<InProcess>>,
    handle: Handle,
    generation: u64,
    /// The calls in flight, which stopping waits for.
    calls: TaskTracker,
}

/// The routes of the running local servers, by the address of their listener (`host:port`).
static ROUTES: Mutex<Vec<(String, Weak<Route>)>> = Mutex::new(Vec::new());

impl Route {
    /// Registers the gate served at `address` by the runtime of `handle`; it is found by
    /// [`find`] until [`Route::withdraw`] (or until the returned route is dropped).
    pub fn register(
        address: String,
        service: InProcess,
        direct: Option<InProcess>,
        handle: Handle,
    ) -> Arc<Route> {
        let route = Arc::new(Route {
            service: Mutex::new(Some(service)),
            direct: Mutex::new(direct),
            handle,
            generation: runtime::generation(),
            calls: TaskTracker::new(),
        });
        let mut routes = ROUTES.lock().unwrap_or_else(PoisonError::into_inner);
        routes.retain(|(_, route)| route.strong_count() > 0);
        routes.push((address, Arc::downgrade(&route)));
        route
    }

    /// The gate stops: no channel made from now on finds it, and a call from now on is refused.
    pub fn withdraw(self: &Arc<Self>) {
        for service in [&self.service, &self.direct] {
            service
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
        self.calls.close();
        let mut routes = ROUTES.lock().unwrap_or_else(PoisonError::into_inner);
        routes.retain(|(_, route)| route.upgrade().is_some_and(|r| !Arc::ptr_eq(&r, self)));
    }

    /// Resolves when the calls in flight when it was withdrawn have finished.
    pub async fn drained(&self) {
        self.calls.wait().await;
    }

    /// Whether this process may call the gate directly: it still serves, and this is not a
    /// forked child. Otherwise a channel goes through the listener's address, as any other does
    /// (where a gate started again on the same address answers).
    pub fn reachable(&self) -> bool {
        self.generation == runtime::generation()
            && self
                .service
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
    }

    /// [`Route::call`] for a thread that waits for it (the GIL released). On Redis the thread
    /// runs the call itself on `runtime` (the blocking callers' runtime, where the direct
    /// connection lives); on the embedded store it sleeps until the gate's thread answers.
    pub fn block(&self, call: wire::Call, runtime: &Runtime) -> Result<Bytes, Status> {
        let direct = self
            .direct
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(service) = direct else {
            return self.handle.block_on(self.call(call));
        };
        let request = request(&call)?;
        runtime.block_on(self.calls.track_future(answered(service, request)))
    }

    /// Answers `call` as the gate's listener would: the response message, or the status.
    pub async fn call(&self, call: wire::Call) -> Result<Bytes, Status> {
        let request = request(&call)?;
        let service = self
            .service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(stopped)?;
        let task = self
            .calls
            .spawn_on(answered(service, request), &self.handle);
        let _dropped_with_the_caller = Abort(task.abort_handle());
        match task.await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => Err(Status::internal(
                "the gate in this process failed while answering",
            )),
            Err(_) => Err(stopped()),
        }
    }
}

fn stopped() -> Status {
    Status::unavailable("the gate in this process has stopped")
}

/// The route to the gate this process serves at `authority` (`host:port`), if any.
pub fn find(authority: &str) -> Option<Arc<Route>> {
    let routes = ROUTES.lock().unwrap_or_else(PoisonError::into_inner);
    routes
        .iter()
        .filter(|(address, _)| address == authority)
        .find_map(|(_, route)| route.upgrade())
}

/// Aborts the call's task when the caller stops waiting for it; nothing once it finished.
struct Abort(AbortHandle);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `call` as the request the listener would have received.
fn request(call: &wire::Call) -> Result<http::Request<Body>, Status> {
    let body = Body::new(Full::new(wire::frame(&call.message)?));
    Ok(wire::head(call)?.map(|()| body))
}

/// `service`'s answer to `request`. Its deadline travels as `grpc-timeout`, which the gate
/// service's own layer enforces (`DEADLINE_EXCEEDED`, as the listener answers it).
async fn answered(service: InProcess, request: http::Request<Body>) -> Result<Bytes, Status> {
    answer(service.call(request).await).await
}

/// The message of a gRPC response, or its status (read as [`crate::unary`] reads one from
/// HTTP/2).
async fn answer(response: Response<Body>) -> Result<Bytes, Status> {
    let (parts, body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(wire::http_status(parts.status));
    }
    if let Some(status) = wire::trailers_only(&parts.headers) {
        return Err(status);
    }
    let collected = body
        .collect()
        .await
        .map_err(|e| Status::internal(format!("the answer's body: {e}")))?;
    let trailers = collected.trailers().cloned();
    wire::ended(collected.to_bytes(), trailers.as_ref())
}
