//! The binary's help, usage errors and exit codes: what needs no server.

use super::*;

/// What needs no server: help, a missing or bad URL, an unreachable one, a password kept out.
#[tokio::test]
async fn usage_errors_and_the_exit_codes_are_told() {
    let help = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--help")
        .output()
        .unwrap());
    assert_eq!(help.code, 0, "{help:?}");
    for says in [
        "Exit status",
        "  1  refused",
        "  2  usage",
        "  3  store error",
        "IDEM_STORE_URL",
    ] {
        assert!(help.stdout.contains(says), "{says:?} in {help:?}");
    }
    for command in ["migrate", "inspect", "stuck", "release", "sweep", "stats"] {
        assert!(help.stdout.contains(command), "{command} in {help:?}");
    }
    let out = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("IDEM_STORE_URL")
        .arg("stats")
        .output()
        .unwrap());
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("IDEM_STORE_URL"), "{out:?}");
    // The URL from the environment.
    let dir = tempfile::tempdir().unwrap();
    let out = ran(Command::new(env!("CARGO_BIN_EXE_idem"))
        .env(
            "IDEM_STORE_URL",
            format!("sqlite:{}", dir.path().join("env.db").display()),
        )
        .arg("migrate")
        .output()
        .unwrap());
    assert_eq!(out.code, 0, "{out:?}");
    // A URL idem cannot open: connect's error, naming the schemes.
    let out = idem("gopher://u:hunter2@h/x", &["stats"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    for scheme in [
        "memory:",
        "sqlite:PATH",
        "mysql://",
        "postgres://",
        "redis://",
        "sharded:",
    ] {
        assert!(out.stderr.contains(scheme), "{scheme} in {out:?}");
    }
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    let out = idem("memory:", &["migrate", "--print"]).await;
    assert_eq!(
        (out.code, out.stdout.contains("no DDL")),
        (0, true),
        "{out:?}"
    );
    // The store timeout: refused out of its range, before anything is opened...
    for bad in ["0s", "5", "25h", "s"] {
        let out = idem("memory:", &["--store-timeout", bad, "stats"]).await;
        assert_eq!(out.code, 2, "--store-timeout {bad}: {out:?}");
        assert!(out.stderr.contains("store-timeout"), "{out:?}");
    }
    // ...and a server that accepts and never answers is a store error once it has run out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("postgres://postgres@{}/test", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let out = idem(&url, &["--store-timeout", "300ms", "stats"]).await;
    let took = started.elapsed();
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("--store-timeout"), "{out:?}");
    assert!(
        took < std::time::Duration::from_secs(4),
        "answered after {took:?}"
    );
    drop(silent);
    // Unreachable: a store error, without the password.
    let out = idem("redis://:hunter2@127.0.0.1:1", &["stats"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.starts_with("error: "), "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    // A store that cannot do what is asked: a store error too.
    let out = idem("sharded:memory:|memory:", &["sweep", "--tokens"]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("does not support"), "{out:?}");
}

/// The help says when `release` is needed at all, and what `stuck` does not list; `migrate`
/// takes its URL after it, as the library's messages print it.
#[tokio::test]
async fn the_help_says_when_to_release_and_what_stuck_leaves_out() {
    let out = idem_bare(&["release", "--help"], None).await;
    assert_eq!(out.code, 0, "{out:?}");
    for says in [
        "Rarely needed",
        "takes an ended lease over by itself",
        "known dead",
        "--mark-failed",
        "refused by the fence",
    ] {
        assert!(out.stdout.contains(says), "{says:?} in {out:?}");
    }
    let out = idem_bare(&["stuck", "--help"], None).await;
    assert_eq!(out.code, 0, "{out:?}");
    for says in [
        "under a lease still running are not listed",
        "idem stats",
        "idem inspect BIZ KEY",
    ] {
        assert!(out.stdout.contains(says), "{says:?} in {out:?}");
    }
    let out = idem_bare(&["migrate", "--help"], None).await;
    assert!(out.stdout.contains("[URL]"), "{out:?}");
    let out = idem_bare(&["migrate", "--print"], None).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("after `migrate`"), "{out:?}");
    let out = idem_bare(&["migrate", "--print", "memory:"], None).await;
    assert_eq!(
        (out.code, out.stdout.contains("no DDL")),
        (0, true),
        "{out:?}"
    );
}

/// A Postgres URL with another server's port (MariaDB's): a server answered, in another
/// protocol; a misconfiguration (exit 2), said without "cannot reach" and without the driver's
/// source location.
#[tokio::test]
async fn a_postgres_url_on_the_mariadb_port_is_a_misconfiguration() {
    let base = server::mysql_url();
    if server::reach("MariaDB", &base, idem::connect(&base))
        .await
        .is_none()
    {
        return;
    }
    // `mysql://user[:pass]@host[:port]/db`: its host and port.
    let authority = base.split_once("://").unwrap().1;
    let authority = authority.split(['/', '?']).next().unwrap();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let address = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:3306")
    };
    let pg = format!("postgres://postgres@{address}/test");
    let Err(e) = idem::connect(&pg).await else {
        panic!("{pg} was opened")
    };
    assert!(
        matches!(e, IdemError::InvalidOptions { .. }) && !e.is_retryable(),
        "{e:?}"
    );
    for args in [&["stats"][..], &["migrate"]] {
        let out = idem(&pg, args).await;
        assert_eq!(out.code, 2, "{out:?}");
        assert!(
            out.stderr.contains(&format!(
                "a server answered at {address}, but not in the Postgres protocol"
            )) && out.stderr.contains("not Postgres"),
            "{out:?}"
        );
        for never in ["cannot reach", "sqlx", "establish:13"] {
            assert!(!out.stderr.contains(never), "{never:?} in {out:?}");
        }
    }
}
