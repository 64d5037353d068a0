//! A private database server for a fault storm, started from the machine's installed binaries in a
//! directory of its own, so it can be paused, killed and started again without touching anyone
//! else's server: Postgres (`initdb`, `pg_ctl`; run as the `postgres` user when this process is
//! root), MariaDB / MySQL (`mariadb-install-db`, `mariadbd`) and Redis (`redis-server`, with an
//! append-only file synced on every write, so a restart forgets nothing it acknowledged).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::StormError;
use crate::args::StoreKind;

/// How long a server may take to start and answer.
const START_WITHIN: Duration = Duration::from_secs(60);

/// One running private server.
pub(crate) struct Server {
    kind: StoreKind,
    dir: PathBuf,
    port: u16,
    /// Postgres's binaries; the server is its postmaster (`pg_ctl` starts it detached).
    pg_bin: Option<PathBuf>,
    /// MariaDB's and Redis's process.
    child: Option<Child>,
}

fn setup(what: impl std::fmt::Display) -> StormError {
    StormError::Setup(what.to_string())
}

/// Runs a command; its output, or an error naming the command and what it printed.
fn run(command: &mut Command) -> Result<String, StormError> {
    let out = command
        .output()
        .map_err(|e| setup(format!("cannot run {command:?}: {e}")))?;
    if !out.status.success() {
        return Err(setup(format!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `bin/tool`, as the `postgres` user when this process is root (Postgres refuses to run as root).
fn pg_tool(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

/// The newest installed Postgres's server binaries.
fn pg_bin() -> Option<PathBuf> {
    let on_path = Command::new("pg_ctl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    majors.sort();
    majors.pop().or_else(|| {
        on_path
            .then(|| which("initdb").and_then(|p| p.parent().map(Path::to_path_buf)))
            .flatten()
    })
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(bin))
            .find(|p| p.exists())
    })
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, StormError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| setup(format!("no free loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| setup(format!("no free loopback port: {e}")))
}

/// Whether this machine can run a fault storm's private server for `kind`: `Err` names what is
/// missing.
///
/// # Errors
/// What is missing: the server's binaries, or (as root) the `postgres` user Postgres runs as.
pub fn available(kind: StoreKind) -> Result<(), String> {
    let have = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    match kind {
        StoreKind::Postgres => match pg_bin() {
            None => Err("no Postgres server binaries (initdb, pg_ctl)".into()),
            Some(_) if is_root() && !have_postgres_user() => Err(
                "running as root, and there is no `postgres` user to run the Postgres server as"
                    .into(),
            ),
            Some(_) => Ok(()),
        },
        StoreKind::Mysql => ["mariadbd", "mariadb-install-db", "mariadb"]
            .into_iter()
            .find(|b| !have(b))
            .map_or(Ok(()), |b| Err(format!("`{b}` is not installed"))),
        StoreKind::Redis => {
            if have("redis-server") {
                Ok(())
            } else {
                Err("`redis-server` is not installed".into())
            }
        }
        other => Err(format!(
            "a fault storm runs on postgres, mysql or redis, not `{}`",
            other.name()
        )),
    }
}

fn have_postgres_user() -> bool {
    Command::new("runuser")
        .args(["-u", "postgres", "--", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

impl Server {
    /// Installs a fresh server for `kind` in a temporary directory of its own (removed when the
    /// server is dropped) and starts it.
    pub(crate) fn start(kind: StoreKind) -> Result<Server, StormError> {
        available(kind).map_err(setup)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("idem-storm-{}-", kind.name()))
            .tempdir()
            .map_err(|e| setup(format!("cannot make a temporary directory: {e}")))?
            .keep();
        let mut server = Server {
            kind,
            dir,
            port: free_port()?,
            pg_bin: None,
            child: None,
        };
        match kind {
            StoreKind::Postgres => server.install_postgres()?,
            StoreKind::Mysql => server.install_mariadb()?,
            _ => {}
        }
        server.launch()?;
        if kind == StoreKind::Mysql {
            server.mariadb_sql(
                "CREATE DATABASE IF NOT EXISTS test; CREATE USER IF NOT EXISTS 'idem'@'%'; \
                 GRANT ALL ON *.* TO 'idem'@'%'",
            )?;
        }
        Ok(server)
    }

    /// The server's URL (direct, not through any proxy).
    pub(crate) fn url(&self) -> String {
        match self.kind {
            StoreKind::Postgres => format!("postgres://postgres@127.0.0.1:{}/postgres", self.port),
            StoreKind::Mysql => format!("mysql://idem@127.0.0.1:{}/test", self.port),
            _ => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn install_postgres(&mut self) -> Result<(), StormError> {
        let bin = pg_bin().ok_or_else(|| setup("no Postgres server binaries"))?;
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&self.dir))?;
        }
        run(pg_tool(&bin, "initdb").arg("-D").arg(self.data()).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]))?;
        // A transaction whose client vanished without closing its connection (a network that
        // came back for new connections only) would hold its claim's row lock until the server
        // noticed, which without this it never does: as a careful operator sets it.
        let conf = "\nfsync = off\nmax_connections = 200\nshared_buffers = 32MB\n\
                    idle_in_transaction_session_timeout = '10s'\n";
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
            .map_err(|e| setup(format!("cannot configure the Postgres server: {e}")))?;
        self.pg_bin = Some(bin);
        Ok(())
    }

    fn install_mariadb(&mut self) -> Result<(), StormError> {
        let tmp = self.dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(setup)?;
        run(Command::new("mariadb-install-db").args([
            "--no-defaults".to_owned(),
            format!("--datadir={}", self.data().display()),
            "--user=root".to_owned(),
            "--auth-root-authentication-method=normal".to_owned(),
            "--skip-test-db".to_owned(),
            format!("--tmpdir={}", tmp.display()),
        ]))?;
        Ok(())
    }

    /// Starts the server on its data and waits until it answers.
    fn launch(&mut self) -> Result<(), StormError> {
        match self.kind {
            StoreKind::Postgres => {
                let bin = self.pg_bin.clone().expect("installed");
                run(pg_tool(&bin, "pg_ctl")
                    .arg("-D")
                    .arg(self.data())
                    .arg("-l")
                    .arg(self.dir.join("postgres.log"))
                    .args(["-w", "-t", "60", "-o"])
                    .arg(format!(
                        "-p {} -k {} -c listen_addresses=127.0.0.1",
                        self.port,
                        self.dir.display()
                    ))
                    .arg("start"))?;
            }
            StoreKind::Mysql => {
                let child = Command::new("mariadbd")
                    .args([
                        "--no-defaults".to_owned(),
                        format!("--datadir={}", self.data().display()),
                        format!("--port={}", self.port),
                        format!("--socket={}", self.dir.join("mysql.sock").display()),
                        "--bind-address=127.0.0.1".to_owned(),
                        "--user=root".to_owned(),
                        format!("--log-error={}", self.dir.join("mariadb.err").display()),
                        format!("--tmpdir={}", self.dir.join("tmp").display()),
                        "--innodb-flush-log-at-trx-commit=2".to_owned(),
                        "--skip-name-resolve".to_owned(),
                        "--max-connections=300".to_owned(),
                        // See the Postgres server's `idle_in_transaction_session_timeout`.
                        "--idle-transaction-timeout=10".to_owned(),
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| setup(format!("cannot start mariadbd: {e}")))?;
                self.child = Some(child);
            }
            _ => {
                let child = Command::new("redis-server")
                    .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                    .arg("--dir")
                    .arg(&self.dir)
                    .args([
                        "--save",
                        "",
                        "--appendonly",
                        "yes",
                        "--appendfsync",
                        "always",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| setup(format!("cannot start redis-server: {e}")))?;
                self.child = Some(child);
            }
        }
        self.wait_until_it_answers()
    }

    fn wait_until_it_answers(&self) -> Result<(), StormError> {
        let start = Instant::now();
        loop {
            let answers = match self.kind {
                // `pg_ctl -w` waited already.
                StoreKind::Postgres => true,
                StoreKind::Mysql => self.mariadb_sql("SELECT 1").is_ok(),
                _ => Command::new("redis-cli")
                    .args(["-p", &self.port.to_string(), "PING"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG")),
            };
            if answers {
                return Ok(());
            }
            if start.elapsed() > START_WITHIN {
                return Err(setup(format!(
                    "the private {} server on port {} did not answer within {START_WITHIN:?} (its files: {})",
                    self.kind.name(),
                    self.port,
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn mariadb_sql(&self, sql: &str) -> Result<String, StormError> {
        run(Command::new("mariadb")
            .args(["--no-defaults", "-u", "root", "-N", "-B", "-S"])
            .arg(self.dir.join("mysql.sock"))
            .args(["-e", sql]))
    }

    /// Every process of the server: Postgres's postmaster and its children; the one process of
    /// the others.
    fn pids(&self) -> Vec<String> {
        match (&self.child, self.kind) {
            (Some(child), _) => vec![child.id().to_string()],
            (None, StoreKind::Postgres) => {
                let Ok(text) = std::fs::read_to_string(self.data().join("postmaster.pid")) else {
                    return Vec::new();
                };
                let Some(main) = text.lines().next().map(|l| l.trim().to_owned()) else {
                    return Vec::new();
                };
                let children = Command::new("pgrep")
                    .args(["-P", &main])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                std::iter::once(main)
                    .chain(children.split_whitespace().map(str::to_owned))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    fn signal(&self, signal: &str) {
        let pids = self.pids();
        if !pids.is_empty() {
            let _ = Command::new("kill")
                .arg(signal)
                .args(&pids)
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Freezes the whole server (SIGSTOP): connections stay open and nothing answers.
    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT).
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server without a shutdown (SIGKILL; Postgres: `pg_ctl stop -m immediate`, which
    /// ends every backend at once and leaves crash recovery to the next start), then, after
    /// `down`, starts it again on the same data and port.
    pub(crate) fn restart(&mut self, down: Duration) -> Result<(), StormError> {
        self.stop_hard();
        std::thread::sleep(down);
        self.launch()
    }

    fn stop_hard(&mut self) {
        self.resume();
        match self.child.take() {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            None => {
                if let Some(bin) = &self.pg_bin {
                    let _ = pg_tool(bin, "pg_ctl")
                        .arg("-D")
                        .arg(self.data())
                        .args(["-m", "immediate", "-w", "stop"])
                        .output();
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_hard();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
