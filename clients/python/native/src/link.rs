//! The connection to one gate: HTTP/2 over TCP (plaintext), opened by the first call that needs
//! it and again by the first call after it broke, and the session open on it ([`Session`]). Its
//! frames are read and written by a task on the runtime of the call that opened it (for a
//! threaded caller, the calling thread drives it inside `block_on`; see [`crate::runtime`]). Owns
//! no call ([`crate::unary`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use h2::client::SendRequest;
use tokio::{net::TcpStream, sync::Mutex};
use tonic::Status;

use crate::{
    session::{Failure, Session},
    wire::Call,
};

/// The connection of one channel on one runtime.
pub struct Link {
    address: String,
    connect_timeout: Duration,
    current: Mutex<Option<Connection>>,
    /// The session on the current connection, once a call opened it ([`crate::session`]).
    session: Mutex<Option<Arc<Session>>>,
    /// Set when the gate answered a session `UNIMPLEMENTED`: every call goes unary.
    unary_only: AtomicBool,
}

/// One HTTP/2 connection: where to start streams, and whether it is known to be gone.
#[derive(Clone)]
pub struct Connection {
    pub send: SendRequest<Bytes>,
    /// Whether this connection served calls before the one at hand (a broken reused connection
    /// may have broken while idle, before the call was written: it is worth one more try).
    pub reused: bool,
    broken: Arc<AtomicBool>,
}

impl Connection {
    /// Marks the connection gone, so that the next call opens a new one.
    pub fn broke(&self) {
        self.broken.store(true, Ordering::Release);
    }
}

impl Link {
    /// A link to `address` (`host:port`) that connects on its first call, waiting at most
    /// `connect_timeout` for TCP.
    pub fn new(address: String, connect_timeout: Duration) -> Self {
        Link {
            address,
            connect_timeout,
            current: Mutex::new(None),
            session: Mutex::new(None),
            unary_only: AtomicBool::new(false),
        }
    }

    /// The current connection, or a new one when there is none or it broke. Must run inside the
    /// runtime that will drive the connection.
    pub async fn connection(&self) -> Result<Connection, Status> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref()
            && !connection.broken.load(Ordering::Acquire)
        {
            return Ok(Connection {
                reused: true,
                ..connection.clone()
            });
        }
        let connection = self.connect().await?;
        *current = Some(connection.clone());
        Ok(connection)
    }

    /// The session for `call`, and whether it served calls before: the open one, or a new one
    /// when none is open or it ended. `None` when this link sends every call unary, or `call`'s
    /// metadata is not the session's.
    pub async fn session(&self, call: &Call) -> Result<Option<(Arc<Session>, bool)>, Failure> {
        if self.unary_only.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut current = self.session.lock().await;
        if let Some(session) = current.as_ref()
            && !session.ended()
        {
            let same = session.metadata == call.metadata;
            return Ok(same.then(|| (Arc::clone(session), true)));
        }
        let connection = self.connection().await.map_err(Failure::Ended)?;
        let session = Session::open(&connection.send, call)
            .await
            .inspect_err(|failure| {
                if let Failure::Ended(_) = failure {
                    connection.broke();
                }
            })?;
        let session = Arc::new(session);
        *current = Some(Arc::clone(&session));
        Ok(Some((session, false)))
    }

    /// From now on every call goes unary: the gate does not know sessions.
    pub fn unary_only(&self) {
        self.unary_only.store(true, Ordering::Release);
    }

    async fn connect(&self) -> Result<Connection, Status> {
        let unavailable = |what: &str, e: &dyn std::error::Error| {
            Status::unavailable(format!("cannot reach {}: {what}: {e}", self.address))
        };
        let stream = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(self.address.as_str()),
        )
        .await
        .map_err(|e| unavailable("tcp connect", &e))?
        .map_err(|e| unavailable("tcp connect", &e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| unavailable("TCP_NODELAY", &e))?;
        let (send, connection) = h2::client::handshake(stream)
            .await
            .map_err(|e| unavailable("HTTP/2 handshake", &e))?;
        let broken = Arc::new(AtomicBool::new(false));
        let gone = Arc::clone(&broken);
        tokio::spawn(async move {
            // Ends when the gate closes the connection, it fails, or every handle is dropped.
            let _ = connection.await;
            gone.store(true, Ordering::Release);
        });
        Ok(Connection {
            send,
            reused: false,
            broken,
        })
    }
}
