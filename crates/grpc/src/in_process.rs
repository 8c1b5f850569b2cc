//! The worker API for a caller in the gate's own process: the listener's gate service (behind
//! the same authenticator, its messages bounded the same way, each call traced, audited and
//! timed by the same [`RpcLayer`]), called with an HTTP request and no socket in between. The
//! Python client's in-process gate (`oncegate.local`) sends its worker calls here instead of over
//! loopback TCP: the answers, the errors and the audit lines are the listener's.
//!
//! What a socket would add and this does not: a peer address and a TLS certificate (an
//! in-process caller is known by its API key, as on a plaintext listener), and the server's own
//! enforcement of `grpc-timeout` (the caller bounds the call by its deadline instead).

use std::{convert::Infallible, future::poll_fn};

use http::{Request, Response};
use oncegate_gate::Gate;
use oncegate_observe::telemetry::layer::{RpcLayer, RpcService};
use tonic::{body::Body, service::Routes};
use tower_layer::Layer as _;
use tower_service::Service;

use super::{auth::Authenticator, server::ServerOptions};

/// The gate service of one server, callable in its process. Cheap to clone.
#[derive(Clone)]
pub struct InProcess {
    service: RpcService<Routes>,
}

impl InProcess {
    /// The worker API of `gate`, as [`crate::server::run`] serves it with `options`.
    pub fn new(gate: &Gate, options: &ServerOptions) -> Self {
        let (service, _) = super::server::services(
            gate,
            options,
            Authenticator::new(options.principals.clone()),
            // Sessions are for a gate across a connection: in process, nothing drains them.
            tokio::sync::watch::channel(false).1,
        );
        let routes = Routes::new(service).prepare();
        InProcess {
            service: RpcLayer::new(gate.metrics().clone()).layer(routes),
        }
    }

    /// Answers one gRPC request (`POST /oncegate.v1.ActionGateService/<Method>`, a framed
    /// message as its body). Any other path is answered `UNIMPLEMENTED`, as by the listener.
    pub async fn call(&self, request: Request<Body>) -> Response<Body> {
        let mut service = self.service.clone();
        let ready: Result<(), Infallible> =
            poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx)).await;
        let Ok(()) = ready;
        let Ok(response) = service.call(request).await;
        response
    }
}
