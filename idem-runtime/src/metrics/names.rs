//! The names of what idem emits through the [`metrics`](https://docs.rs/metrics) facade with the
//! `metrics` feature. Install any recorder (`metrics-exporter-prometheus`, …) to export them;
//! without one they cost a few nanoseconds and go nowhere. Labels never carry a key, a token or a
//! result.
//!
//! | Metric | Kind | Labels |
//! |---|---|---|
//! | `idem_calls_total` | counter | `biz`, `outcome` (`executed`, `replayed`, `in_progress`, `mismatch`, `result_expired`, `taken_over`, `recovered`, `recover_failed`, `failed`, …: [`Outcome::as_str`](super::Outcome::as_str)) |
//! | `idem_duplicates_total` | counter | `biz` (duplicate rate = this / `idem_calls_total`) |
//! | `idem_lease_takeovers_total` | counter | `biz` |
//! | `idem_claim_seconds` | histogram | `biz`, `store` |
//! | `idem_sweeper_deleted_total` | counter | `store`, `kind` (`records`, `tokens`) |
//! | `idem_store_retries_total` | counter | `store`, `reason` (`deadlock`): claims a store ran again after the database picked them as a deadlock victim |
//! | `idem_stuck_records` | gauge | `biz`: stuck records (PROCESSING, lease ended) the last `Reconciler` pass found |
//! | `idem_recovered_total` | counter | `biz`, `how` (`succeeded`, `failed`, `undecided`): stuck records a `Reconciler` resolved |
//! | `idem_replay_cache_hits_total` | counter | `store`: claims a `CachedStore` answered from memory (feature `cache`) |
//! | `idem_token_ops_total` | counter | `op` (`issue`, `consume`, `restore`), `outcome` (`ok`, `used`, `invalid`, `error`): where idem performs them (`#[consume_token]`, the HTTP guard and endpoint) |
//!
//! The feature is off by default (it adds three crates to the build). Next to it, and with it
//! off: every call is a `tracing` span `idem` (fields `biz`, `outcome`, `attempt`; no span is
//! made while no subscriber takes `INFO`), and the in-process counters
//! ([`counts`](super::counts), [`counts_for`](super::counts_for)) and
//! [`observe`](super::observe) are always there.

/// Counter: finished calls, labelled `biz` and `outcome` (the names of
/// [`Outcome::as_str`](super::Outcome::as_str)).
pub const CALLS: &str = "idem_calls_total";
/// Counter: calls that were duplicates of one already seen (replayed, in progress, mismatch),
/// labelled `biz`; the duplicate rate is this over [`CALLS`].
pub const DUPLICATES: &str = "idem_duplicates_total";
/// Counter: claims taken over from an attempt whose lease expired, labelled `biz`.
pub const LEASE_TAKEOVERS: &str = "idem_lease_takeovers_total";
/// Histogram, seconds: one claim's round trip to the store (transient errors retried
/// included), labelled `biz` and `store` (the backend's name).
pub const CLAIM_SECONDS: &str = "idem_claim_seconds";
/// Counter: expired rows a [`Sweeper`](crate::Sweeper) deleted, labelled `store` and `kind`
/// (`records` or `tokens`).
pub const SWEPT: &str = "idem_sweeper_deleted_total";
/// Counter: lease-mode claims (of one key or a batch) a store ran again after the database
/// picked them as a deadlock victim, labelled `store` and `reason` (`deadlock`).
pub const STORE_RETRIES: &str = "idem_store_retries_total";
/// Counter: one-time token operations where idem performs them (`#[consume_token]`, the HTTP
/// token guard and token endpoint), labelled `op` (`issue`, `consume`, `restore`) and
/// `outcome` (`ok`, `used`, `invalid`, `error`).
pub const TOKENS: &str = "idem_token_ops_total";
/// Gauge: stuck records (PROCESSING, lease ended) the last [`Reconciler`](crate::Reconciler)
/// pass found, labelled `biz`.
pub const STUCK: &str = "idem_stuck_records";
/// Counter: stuck records a [`Reconciler`](crate::Reconciler) resolved, labelled `biz` and
/// `how` (`succeeded`: the result was backfilled; `failed`: released for a retry;
/// `undecided`: the recover fn could not tell, the record was left).
pub const RECOVERED: &str = "idem_recovered_total";
/// Counter, label `store` (the inner store's backend): claims a [`crate::cache::CachedStore`]'s
/// replay cache answered (feature `cache`).
pub const REPLAY_CACHE_HITS: &str = "idem_replay_cache_hits_total";
