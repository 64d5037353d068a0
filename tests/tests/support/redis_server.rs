//! Redis servers a test starts itself from the installed `redis-server` (loopback, daemonized, in
//! a directory of their own), to restart, kill or pause them: what the shared local Redis cannot be
//! put through.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether `redis-server` and `redis-cli` are installed; when not, prints one skip line (or
/// panics under `IDEM_REQUIRE_SERVICES=1`).
pub fn installed() -> bool {
    let found = ["redis-server", "redis-cli"]
        .iter()
        .all(|bin| Command::new(bin).arg("--version").output().is_ok());
    if !found {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "redis-server / redis-cli are not installed and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: redis-server / redis-cli are not installed");
    }
    found
}

/// A directory of this process for servers' files, removed by the caller.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A range of `n` free ports from `base`, picked by the process id so concurrent runs do not meet,
/// and skipping ranges where a port is taken. Keep `base + 900 * n` (and a cluster's bus ports,
/// `+ 10000`) below the kernel's ephemeral range (32768 and up): a client's outgoing connection may
/// hold any port there.
pub fn ports(base: u16, n: u16) -> impl Iterator<Item = u16> {
    let pid = std::process::id() as u16;
    let free = |first: u16| {
        (first..first + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
    };
    let first = (0..900u16)
        .map(|k| base + (pid.wrapping_add(k) % 900) * n)
        .find(|&first| free(first))
        .expect("a free port range");
    first..first + n
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on `port` with its files in `dir` and `args` (e.g. persistence settings),
    /// and waits until it answers.
    /// A server that keeps every write it acknowledged: AOF with `appendfsync always`, no RDB.
    pub fn start_durable(port: u16, dir: &Path) -> RedisServer {
        Self::start(
            port,
            dir,
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
        )
    }

    pub fn start(port: u16, dir: &Path, args: &[&str]) -> RedisServer {
        let server = RedisServer {
            port,
            dir: dir.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.launch();
        server
    }

    fn launch(&self) {
        let port = self.port.to_string();
        let status = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--daemonize", "yes"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(["--logfile", &format!("redis-{port}.log")])
            .args([
                "--pidfile",
                self.dir.join(format!("redis-{port}.pid")).to_str().unwrap(),
            ])
            .args(&self.args)
            .status()
            .expect("redis-server runs");
        assert!(status.success(), "redis-server on {port} did not start");
        self.wait_for(|reply| reply.contains("PONG"), &["PING"]);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli -p <port> args…`, its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls `redis-cli args` until `ready` accepts its output (60 s at most: a loaded machine is slow to start a node).
    pub fn wait_for(&self, ready: impl Fn(&str) -> bool, args: &[&str]) {
        let start = Instant::now();
        loop {
            let reply = self.cli(args);
            if ready(&reply) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "redis on {} not ready: {reply}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self) -> String {
        let info = self.cli(&["INFO", "server"]);
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .map(|p| p.trim().to_owned())
            .expect("redis reports its process id")
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Stops the server without saving (what a crash or a restart without persistence does).
    pub fn shutdown_nosave(&self) {
        let _ = self.cli(&["SHUTDOWN", "NOSAVE"]);
        self.wait_gone();
    }

    /// Kills the process (SIGKILL): no shutdown, no last save; only what is on disk survives.
    pub fn kill(&self) {
        self.signal("-KILL");
        self.wait_gone();
    }

    /// Freezes the process (SIGSTOP): it neither answers nor replicates until [`Self::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        let pid = std::fs::read_to_string(self.dir.join(format!("redis-{}.pid", self.port)))
            .expect("the pid file");
        let status = Command::new("kill")
            .args(["-CONT", pid.trim()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Starts the server again with the same port, directory and settings.
    pub fn start_again(&self) {
        self.launch();
    }

    fn wait_gone(&self) {
        let start = Instant::now();
        while Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "redis on {} did not stop",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server must run again to hear the shutdown.
        if let Ok(pid) = std::fs::read_to_string(self.dir.join(format!("redis-{}.pid", self.port)))
        {
            let _ = Command::new("kill").args(["-CONT", pid.trim()]).status();
        }
        let _ = self.cli(&["SHUTDOWN", "NOSAVE"]);
    }
}
