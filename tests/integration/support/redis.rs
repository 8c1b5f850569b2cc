//! A `redis-server` of the test's own on a free loopback port, and that port. Cluster and Sentinel
//! deployments built from these are in [`super::topology`]; stores on top of them in
//! [`super::stores`].

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tempfile::TempDir;

/// A free TCP port on 127.0.0.1 (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the test's own, on a free loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// A Redis that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// Settings every test server gets: replicas sync at once instead of after the default
    /// 5 s diskless-sync delay.
    fn common_args() -> [&'static str; 2] {
        ["--repl-diskless-sync-delay", "0"]
    }

    /// A Redis with extra command-line settings.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            dir: TempDir::new().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
            ])
            .arg(self.dir.path())
            .args(Self::common_args())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make test installs it on Debian)");
        self.child = Some(child);
        wait_for_redis(self.port);
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits (up to 10 s) until the server on `port` answers `PING`.
pub(super) fn wait_for_redis(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            if stream.write_all(b"PING\r\n").is_ok() {
                let mut buf = [0u8; 7];
                if stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not start");
}
