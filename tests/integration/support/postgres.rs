//! A PostgreSQL server of the test's own, from the Debian binaries (`pg_config --bindir`): its
//! data directory in a temp dir (made by `initdb`, or by the caller, e.g. `pg_basebackup` for a
//! standby), listening on a free loopback port and a unix socket in that temp dir, `fsync` on,
//! trust authentication from 127.0.0.1 and the socket only. It never touches a PostgreSQL already
//! running on the machine (that one's port and socket are never used).
//!
//! Its processes are one process group, stopped on drop; a watchdog process kills the group when
//! the test process dies without dropping it (a SIGKILLed test run, or a server kept in a
//! `static`). As root (the CI), the server runs as the `postgres` user, since PostgreSQL refuses
//! to run as root.
//!
//! Also here: [`shared`], one server per test process on which [`fresh_database`] makes each
//! test a database of its own (what `Kind::Postgres` uses: an `initdb` per test costs more CPU
//! than the test). Does not own: the store on top ([`super::stores`]), replicated pairs (built
//! on [`PgServer::from_data_dir`] and [`PgServer::start_with`]).

use std::{
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use tempfile::TempDir;

use super::redis::free_port;

/// The superuser `initdb` makes (and the user of [`PgServer::url`]).
pub const SUPERUSER: &str = "postgres";

/// A PostgreSQL server of the test's own, stopped on drop.
pub struct PgServer {
    pub port: u16,
    dir: TempDir,
    extra: Vec<String>,
    child: Option<Child>,
    watchdog: Option<Child>,
}

/// The directory of the PostgreSQL binaries (`pg_config --bindir`).
pub fn bindir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .expect("pg_config must be installed (`make deps` installs PostgreSQL on Debian)");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
    .clone()
}

/// A PostgreSQL program of [`bindir`], run as the server's user.
pub fn program(name: &str) -> Command {
    let mut cmd = Command::new(bindir().join(name));
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    cmd.current_dir("/");
    cmd
}

/// The (uid, gid) the server runs as when the tests run as root: the `postgres` user's.
fn server_user() -> Option<(u32, u32)> {
    static USER: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *USER.get_or_init(|| {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").arg(flag).output().ok()?;
            String::from_utf8(out.stdout).ok()?.trim().parse().ok()
        };
        if id("-u")? != 0 {
            return None;
        }
        let uid = Command::new("id").args(["-u", "postgres"]).output().ok()?;
        let gid = Command::new("id").args(["-g", "postgres"]).output().ok()?;
        let parse = |b: Vec<u8>| String::from_utf8(b).ok()?.trim().parse::<u32>().ok();
        Some((
            parse(uid.stdout).expect("as root, the tests run PostgreSQL as the `postgres` user"),
            parse(gid.stdout)?,
        ))
    })
}

/// A temp dir the server's user owns.
pub fn server_dir() -> TempDir {
    let dir = TempDir::new().unwrap();
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    }
    dir
}

impl PgServer {
    /// A fresh server (`initdb`), started.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A fresh server with extra `postgresql.conf` lines (`"synchronous_commit = off"`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = server_dir();
        let data = dir.path().join("data");
        let out = program("initdb")
            .args(["--auth=trust", "--username", SUPERUSER, "--encoding=UTF8"])
            .args(["--locale=C", "--no-instructions", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self::from_data_dir(dir, extra)
    }

    /// A server on a data directory made by the caller at `dir/data` (a base backup, for a
    /// standby), with extra `postgresql.conf` lines, on a free port, started.
    pub fn from_data_dir(dir: TempDir, extra: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            watchdog: None,
        };
        server.write_conf();
        server.spawn();
        server
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of its unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// `postgresql://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `db` as the superuser.
    pub fn url_for(&self, db: &str) -> String {
        format!("postgresql://{SUPERUSER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Our settings, then the caller's, appended to `postgresql.conf` (the last one of a name
    /// wins), so that a base backup of this server carries them too.
    fn write_conf(&self) {
        let mut conf = vec![
            "listen_addresses = '127.0.0.1'".to_owned(),
            format!("unix_socket_directories = '{}'", self.socket_dir().display()),
            "fsync = on".into(),
            "synchronous_commit = on".into(),
            "max_connections = 300".into(),
            "shared_buffers = 32MB".into(),
            "logging_collector = off".into(),
        ];
        conf.extend(self.extra.iter().cloned());
        let path = self.data_dir().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str("\n# oncegate tests\n");
        for line in conf {
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
    }

    /// Appends `postgresql.conf` lines and has the server reload them.
    pub fn reconfigure(&mut self, lines: &[&str]) {
        let path = self.data_dir().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
        self.psql("postgres", "SELECT pg_reload_conf()");
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        if let Some((uid, gid)) = server_user() {
            let _ = std::os::unix::fs::chown(self.dir.path().join("server.log"), Some(uid), Some(gid));
        }
        let child = program("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres must be installed (`make deps` installs it on Debian)");
        let group = child.id();
        self.child = Some(child);
        // Kills the group when this test process ends without dropping the server.
        self.watchdog = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -KILL -{group} 2>/dev/null",
                std::process::id()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        self.wait_ready();
    }

    /// Waits (up to 60 s) until the server accepts connections.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let ready = Command::new(bindir().join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("postgres exited ({status}): {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postgres on port {} did not start: {}", self.port, self.log());
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The postmaster's pid (its process group's id), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal_group(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args([signal, "--", &format!("-{pid}")])
                .status();
        }
    }

    /// Kills every process of the server (SIGKILL to its group) and waits for the postmaster: a
    /// crash, as far as the data directory knows.
    pub fn kill(&mut self) {
        self.signal_group("-KILL");
        self.reap();
    }

    /// Stops the server cleanly (fast shutdown: SIGINT) and waits for it.
    pub fn stop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    /// Starts the server again on the same port and data directory (after [`PgServer::stop`] or
    /// [`PgServer::kill`]); a killed one recovers from its WAL first.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Freezes every process of the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal_group("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal_group("-CONT");
    }

    /// Runs `sql` in database `db` with `psql` over the socket; its output, unaligned, tuples
    /// only. Panics when it fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self.try_psql(db, sql);
        out.unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }

    /// [`PgServer::psql`], its error as text.
    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = program("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", db, "-c", sql])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Thawed first: a stopped process group does not act on SIGKILL's consequences (its
        // postmaster cannot be reaped) until it runs.
        self.resume();
        self.kill();
    }
}

/// The server every `Kind::Postgres` store of this test process shares (one database each),
/// started on first use, killed by its watchdog when the process ends.
pub fn shared() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(PgServer::start)
}

/// A new, empty database on the [`shared`] server; its URL.
pub fn fresh_database() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let server = shared();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    server.psql("postgres", &format!("CREATE DATABASE {name}"));
    server.url_for(&name)
}
