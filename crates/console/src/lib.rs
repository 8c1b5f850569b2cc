//! The operator console: web pages served by the gate for the people its promise waits on.
//! Approvers decide held actions (the exact params, the policy and its reason, approve or deny
//! with a note); operators also settle unresolved actions, search recent decisions, and read
//! budgets and the duplicate-action rate. Server-rendered HTML with a little CSS and no script.
//!
//! Owns: its listener and HTTP ([`serve`]), sessions and how one starts (an API key checked as
//! the gRPC API checks it, or a one-time code from `oncegate admin console-login`; `session`),
//! CSRF checks (`routes`), the pages (`pages`, escaped by `html`). Calls the gate's operator
//! operations directly, after the same principal and capability check the operator API
//! makes, so timing, counting and audit happen once, in the gate. Does not: decide anything the
//! gate decides, keep anything across a restart (sessions and codes live in this process).

mod asked;
mod html;
mod pages;
mod respond;
mod routes;
mod session;

use std::{convert::Infallible, future::Future, sync::Arc};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use oncegate_gate::Gate;
use oncegate_grpc::auth::{LoginCodes, Principals};

pub use session::SESSION_TTL;

/// How many RequestToken decisions the console keeps in memory to list (this replica's).
pub const RECENT_DECISIONS: usize = 1000;

/// The cookie that carries the session id.
pub const SESSION_COOKIE: &str = "oncegate_console";

/// What the console serves: the gate, who may log in, the one-time codes the admin API issues.
/// Cheap to clone.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    gate: Gate,
    principals: Principals,
    logins: LoginCodes,
    sessions: session::Sessions,
}

impl Console {
    /// A console over `gate` (build it [`Gate::with_recent_decisions`] to list decisions), whose
    /// people log in with an API key of `principals` or a code of `logins`.
    pub fn new(gate: Gate, principals: Principals, logins: LoginCodes) -> Self {
        Self {
            inner: Arc::new(Inner {
                gate,
                principals,
                logins,
                sessions: session::Sessions::default(),
            }),
        }
    }
}

/// Serves the console on `listener` (HTTP/1.1) until `shutdown` resolves.
pub async fn serve(listener: TcpListener, console: Console, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "console listener: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let console = console.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(routes::handle(&console, req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "console connection ended with an error");
            }
        });
    }
}
