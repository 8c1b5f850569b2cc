//! A webhook receiver of the test's own: a real HTTP/1.1 server (hyper) on `127.0.0.1:0` that
//! records every delivery (headers and body) and answers as the test says: 2xx, an error status,
//! or not at all (it holds the request until the caller gives up). Signatures
//! are checked here with HMAC-SHA256 as the Standard Webhooks specification writes it, apart from
//! the gate's own signing code.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;

/// How the receiver answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 204.
    Ok,
    /// This status, for every request.
    Status(u16),
    /// This status for the next `n` requests, then 204.
    StatusThenOk(u16, usize),
    /// Holds every request without answering (the caller gives up or dies).
    Stall,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub timestamp: String,
    pub signature: Option<String>,
    pub content_type: String,
    pub body: String,
}

impl Delivery {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// Whether a signature in the header is `secret`'s (a `whsec_` secret) over this delivery.
    pub fn signed_by(&self, secret: &str) -> bool {
        use hmac::{Hmac, KeyInit, Mac};
        let key = STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap())
            .unwrap();
        let content = format!("{}.{}.{}", self.id, self.timestamp, self.body);
        let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&key).unwrap();
        mac.update(content.as_bytes());
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        self.signature
            .as_deref()
            .is_some_and(|header| header.split(' ').any(|s| s == expected))
    }
}

struct State {
    answer: Answer,
    got: Vec<Delivery>,
}

/// The receiver; it stops serving when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts a receiver answering `answer`.
    pub async fn start(answer: Answer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            answer,
            got: Vec::new(),
        }));
        let s = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, s.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// The URL to configure.
    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    /// Answers the next requests `answer`.
    pub fn answer(&self, answer: Answer) {
        self.state.lock().unwrap().answer = answer;
    }

    /// Every request so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state.lock().unwrap().got.clone()
    }

    /// Waits (up to 20 s) until `ready` holds for the requests so far, and returns them.
    pub async fn wait_until(
        &self,
        what: &str,
        ready: impl Fn(&[Delivery]) -> bool,
    ) -> Vec<Delivery> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.deliveries();
            if ready(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver never got {what}: {got:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until some request's CloudEvents `type` is `dev.oncegate.<event>` and returns those.
    pub async fn wait_for_type(&self, event: &str) -> Vec<Delivery> {
        let full = format!("dev.oncegate.{event}");
        let of_type = |got: &[Delivery]| -> Vec<Delivery> {
            got.iter()
                .filter(|d| {
                    serde_json::from_str::<serde_json::Value>(&d.body)
                        .is_ok_and(|b| b["type"] == full.as_str())
                })
                .cloned()
                .collect()
        };
        let got = self.wait_until(&full, |got| !of_type(got).is_empty()).await;
        of_type(&got)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (id, timestamp, signature, content_type) = (
        header("webhook-id").unwrap_or_default(),
        header("webhook-timestamp").unwrap_or_default(),
        header("webhook-signature"),
        header("content-type").unwrap_or_default(),
    );
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let answer = {
        let mut state = state.lock().unwrap();
        state.got.push(Delivery {
            id,
            timestamp,
            signature,
            content_type,
            body: String::from_utf8(body.to_vec()).unwrap(),
        });
        let answer = state.answer;
        if let Answer::StatusThenOk(status, n) = answer {
            state.answer = match n {
                0 | 1 => Answer::Ok,
                n => Answer::StatusThenOk(status, n - 1),
            };
        }
        answer
    };
    let status = match answer {
        Answer::Ok => 204,
        Answer::Status(status) | Answer::StatusThenOk(status, _) => status,
        Answer::Stall => std::future::pending().await,
    };
    Ok(Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap())
}
