//! What the suites of server-backed stores share: the server's URL, the skip-or-fail rule when it
//! cannot be reached, and names unique to one test so runs do not collide.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

/// The URL in `var`, or `default` (the local service).
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Whether an unreachable service is a failure (`IDEM_REQUIRE_SERVICES=1`, set by CI) rather than a
/// skip.
pub fn required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Runs `connect`; when it fails, prints one skip line (or panics under `IDEM_REQUIRE_SERVICES=1`)
/// and gives `None`.
pub async fn reach<T, E: std::fmt::Display>(
    service: &str,
    url: &str,
    connect: impl Future<Output = Result<T, E>>,
) -> Option<T> {
    match connect.await {
        Ok(value) => Some(value),
        Err(e) if required() => {
            panic!("{service} at {url} is unreachable and IDEM_REQUIRE_SERVICES=1: {e}")
        }
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("skipped: {service} at {url} is unreachable ({e}); set IDEM_REQUIRE_SERVICES=1 to fail instead")
            });
            None
        }
    }
}

/// A name no other test of this run (or a concurrent run) uses: `prefix_<pid>_<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
