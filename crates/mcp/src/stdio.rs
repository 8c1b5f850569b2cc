//! The gateway's stdio transport (server side): rmcp's newline-delimited JSON-RPC, read here so
//! that each `tools/call` carries its arguments as sent ([`super::sent`]). Writing is rmcp's own
//! ([`AsyncRwTransport`]). Reading follows rmcp's: lines up to 16 MiB, a read cancelled midway
//! resumes the same line, text that is not JSON is ignored; well-formed JSON that is no MCP
//! message is answered with a JSON-RPC error under its own id when it has one.

use std::sync::Arc;

use rmcp::{
    ErrorData, RoleServer,
    model::{ClientRequest, JsonRpcMessage},
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::{Transport, async_rw::AsyncRwTransport},
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};

use super::sent;

/// Longest line read (one JSON-RPC message), as rmcp's stdio transport.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// A server-side transport over a reader and a writer (the process's stdin and stdout).
pub struct Stdio<R, W: AsyncWrite> {
    read: BufReader<R>,
    line: Vec<u8>,
    /// Dropping the rest of a line longer than [`MAX_LINE`].
    discarding: bool,
    write: Arc<tokio::sync::Mutex<AsyncRwTransport<RoleServer, tokio::io::Empty, W>>>,
}

impl<R, W> Stdio<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// Reads messages from `read`, writes them to `write`.
    pub fn new(read: R, write: W) -> Self {
        Self {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(tokio::sync::Mutex::new(AsyncRwTransport::new_server(
                tokio::io::empty(),
                write,
            ))),
        }
    }

    /// Reads up to the next newline into `self.line`; `false` at the end of the input. Nothing
    /// read is lost when the future is dropped (the service polls `receive` in a `select!`).
    async fn read_line(&mut self) -> std::io::Result<bool> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(false);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            if !self.discarding {
                if self.line.len() + take > MAX_LINE {
                    tracing::error!(
                        max = MAX_LINE,
                        "an incoming message is longer than the limit: dropped"
                    );
                    self.line.clear();
                    self.discarding = true;
                } else {
                    self.line.extend_from_slice(&available[..take]);
                }
            }
            self.read.consume(take);
            if newline.is_some() {
                if std::mem::take(&mut self.discarding) {
                    continue;
                }
                return Ok(true);
            }
        }
    }

    /// The message on one line, with its arguments as sent when it is a `tools/call`.
    fn parse(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        let Ok(text) = std::str::from_utf8(line) else {
            tracing::debug!("ignoring an incoming line that is not UTF-8");
            return None;
        };
        let (readable, sent) = sent::prepare(text);
        match serde_json::from_str::<RxJsonRpcMessage<RoleServer>>(&readable) {
            Ok(mut message) => {
                if let JsonRpcMessage::Request(request) = &mut message
                    && let ClientRequest::CallToolRequest(call) = &mut request.request
                    && let Some(sent) = sent
                {
                    call.extensions.insert(sent);
                }
                Some(message)
            }
            Err(e) if e.is_syntax() || e.is_eof() => {
                // No id to answer under, and answering garbage can start an echo storm.
                tracing::debug!(error = %e, "ignoring an incoming line that is not JSON");
                None
            }
            Err(e) => {
                self.refuse(text, &e);
                None
            }
        }
    }

    /// Answers well-formed JSON that is no MCP message, under its id when it has one.
    fn refuse(&self, text: &str, error: &serde_json::Error) {
        let id = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| serde_json::from_value(v.get("id")?.clone()).ok());
        let answer = TxJsonRpcMessage::<RoleServer>::error(
            ErrorData::invalid_request(format!("Invalid request: {error}"), None),
            id,
        );
        let write = self.write.clone();
        tokio::spawn(async move {
            let send = write.lock().await.send(answer);
            if let Err(e) = send.await {
                tracing::debug!(error = %e, "could not answer an invalid request");
            }
        });
    }
}

impl<R, W> Transport<RoleServer> for Stdio<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            let send = write.lock().await.send(item);
            send.await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "reading the MCP client's messages failed");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let trimmed = line.strip_suffix(b"\n").unwrap_or(&line);
            let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
            if trimmed.is_empty() {
                continue;
            }
            if let Some(message) = self.parse(trimmed) {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.close().await
    }
}
