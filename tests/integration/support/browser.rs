//! A real headless Chromium, driven over the W3C WebDriver protocol by its own `chromedriver`
//! (Debian's `chromium` and `chromium-driver`: `make deps` installs them), started on a free
//! loopback port and stopped on drop. Just the commands the console tests use: open a URL, find
//! elements by CSS selector, read their text, type, click, run a line of script, and take a
//! screenshot.

use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use base64::Engine as _;
use serde_json::{Value, json};
use tempfile::TempDir;

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session, with its chromedriver.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: TempDir,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

/// A plain HTTP client that does not follow redirects (what a forged request looks like).
pub fn http_client() -> reqwest::Client {
    // reqwest is built without a TLS provider of its own; these calls are plain HTTP, but the
    // client still wants one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; `make deps` installs it)");
        let http = http_client();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = match http.get(format!("{base}/status")).send().await {
                Ok(r) => serde_json::from_slice::<Value>(&r.bytes().await.unwrap_or_default())
                    .ok()
                    .is_some_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = TempDir::new().unwrap();
        let mut browser = Self {
            driver,
            base,
            session: String::new(),
            http,
            _profile: profile,
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1280,1000",
                    format!("--user-data-dir={}", browser._profile.path().display())],
            },
        }}});
        let created = browser.call("POST", "/session", caps).await;
        browser.session = created["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// One WebDriver command; its `value`. Panics with the driver's error.
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        match self.try_call(method, path, body).await {
            Ok(value) => value,
            Err(answer) => panic!("WebDriver {method} {path}: {answer}"),
        }
    }

    /// One WebDriver command: its `value`, or the driver's error answer.
    async fn try_call(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string()),
        };
        let response = request.send().await.unwrap();
        let status = response.status();
        let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        match status.is_success() {
            true => Ok(answer["value"].clone()),
            false => Err(answer),
        }
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.call("POST", &self.at("/url"), json!({ "url": url }))
            .await;
    }

    /// The current page's URL.
    pub async fn url(&self) -> String {
        let value = self.call("GET", &self.at("/url"), Value::Null).await;
        value.as_str().unwrap().to_owned()
    }

    /// Every element matching `css`.
    pub async fn all(&self, css: &str) -> Vec<Element> {
        let body = json!({"using": "css selector", "value": css});
        let found = self.call("POST", &self.at("/elements"), body).await;
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let id = e[ELEMENT].as_str();
                Element(
                    id.unwrap_or_else(|| panic!("not an element: {e}"))
                        .to_owned(),
                )
            })
            .collect()
    }

    /// The first element matching `css`, waiting up to 10 s for one (a page a click submitted
    /// may still be loading when the click returns); panics when none comes.
    pub async fn find(&self, css: &str) -> Element {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut found = self.all(css).await;
            if !found.is_empty() {
                return found.remove(0);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no element matches {css:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        self.text_of(&element).await
    }

    /// The rendered text of `element`.
    pub async fn text_of(&self, element: &Element) -> String {
        let path = self.at(&format!("/element/{}/text", element.0));
        let value = self.call("GET", &path, Value::Null).await;
        value.as_str().unwrap().to_owned()
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        let path = self.at(&format!("/element/{}/value", element.0));
        self.call("POST", &path, json!({ "text": text })).await;
    }

    /// Clicks the first element matching `css` (a submit button waits for the next page).
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        // Every click of these tests submits a form: wait until the page it loads is there (the
        // click may return before the navigation ends), so that the next look is at the new page.
        self.run("window.__oncegateClicked = true; return true")
            .await;
        let path = self.at(&format!("/element/{}/click", element.0));
        self.call("POST", &path, json!({})).await;
        let loaded = json!({
            "script": "return window.__oncegateClicked === undefined && document.readyState === 'complete'",
            "args": [],
        });
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // While the page changes, the script may find no document: ask again.
            let answer = self
                .try_call("POST", &self.at("/execute/sync"), loaded.clone())
                .await;
            if answer == Ok(Value::Bool(true)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "clicking {css:?} loaded no new page: {answer:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Runs `script` in the page (what a tampering user could do in the developer tools).
    pub async fn run(&self, script: &str) -> Value {
        let body = json!({ "script": script, "args": [] });
        self.call("POST", &self.at("/execute/sync"), body).await
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let value = self.call("GET", &self.at("/screenshot"), Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap())
            .unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    /// Ends chromedriver and the Chromium it started: they run in a process group of their own,
    /// so a failed test leaves no browser behind either.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.wait();
    }
}
