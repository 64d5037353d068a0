//! Errors: [`IdemError`], the one error type of idem (also at the crate root), and what its
//! variants carry ([`Busy`], [`DecryptFailure`], [`BoxError`]).

use std::time::Duration;

/// Boxed backend error kept as the `source` of an [`IdemError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything idem can refuse or fail with.
///
/// Every variant says whether a retry can help ([`IdemError::is_retryable`]) and which HTTP status
/// a service would answer with ([`IdemError::http_status`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdemError {
    /// The key is empty, too long, or contains a byte that cannot be stored (NUL). Nothing was written.
    #[error("invalid idempotency key: {reason}")]
    InvalidKey {
        /// What is wrong with the key.
        reason: String,
    },
    /// The business type is empty, too long for the store, or contains whitespace or NUL. Nothing was written.
    #[error("invalid business type `{biz}`: {reason}")]
    InvalidBiz {
        /// The business type as given.
        biz: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The call's options contradict each other (a TTL not longer than the lease), or the store is
    /// misconfigured (a store URL idem cannot open: an unknown scheme, an option the backend does
    /// not have, a server at its address that does not speak the backend's protocol): a mistake
    /// of the service, not of its client (HTTP 500), that no retry cures. Nothing was written.
    #[error("invalid idempotency options: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: String,
    },
    /// Another attempt holds a valid lease on this key; try again after `retry_after`.
    #[error("a call with this key is still in progress; retry after {retry_after:?}")]
    InProgress {
        /// How long the current lease still runs, by the store's clock.
        retry_after: Duration,
    },
    /// A record exists for this key, made from a different request payload (fingerprint).
    #[error("this idempotency key was already used with a different request payload")]
    PayloadMismatch,
    /// This key was used and its call finished, but its result is no longer kept: the call's
    /// result ttl ([`crate::Call::result_ttl`]) passed, and the key stays used (a tombstone)
    /// until its ttl ends. The body did not run again; nothing was written (HTTP 410 Gone).
    /// Permanent: a retry gets the same answer; a new request needs a new key.
    #[error(
        "this idempotency key was already used and its call finished, but its result is no longer kept; the call did not run again"
    )]
    ResultExpired,
    /// This attempt's lease expired and a newer attempt took the claim over; this attempt's result was
    /// not stored and the newer attempt's record was left untouched.
    #[error(
        "the lease of attempt {attempt} expired and another attempt took over; the result was not stored"
    )]
    LeaseLost {
        /// The attempt number this call held.
        attempt: u32,
    },
    /// The business ran, but its result could not be stored for replay (it failed to serialize or
    /// exceeds the store's snapshot limit). The claim is kept as done, so repeats get this error
    /// again instead of running the business a second time.
    #[error("the call ran, but its result cannot be stored for replay: {reason}")]
    ResultNotStorable {
        /// Why the result could not be stored.
        reason: String,
    },
    /// A stored result could not be decoded into the function's return type (the type changed
    /// since the record was written).
    #[error("the stored result cannot be decoded as the current return type: {reason}")]
    ReplayDecode {
        /// The decoder's message.
        reason: String,
    },
    /// [`crate::preflight`] found stores the attributes name that are not registered, not
    /// migrated or not answering: every problem, one per line.
    #[error("idem preflight found {} problem(s):\n- {}", problems.len(), problems.join("\n- "))]
    Preflight {
        /// What is wrong, each with what to do.
        problems: Vec<String>,
    },
    /// A recovery point ([`crate::step`]) could not be used: its name is out of range, the body
    /// has more than [`crate::steps::MAX_STEPS`] steps, its result cannot be encoded or is too large to
    /// save, or a saved result no longer decodes as the step's type. The reason says whether the
    /// step's work ran (HTTP 500: the service's own mistake).
    #[error("recovery point `{step}`: {reason}")]
    Step {
        /// The step's name.
        step: String,
        /// What is wrong, and whether the step's work ran.
        reason: String,
    },
    /// A stored result snapshot could not be opened by an `EncryptedStore` (feature `encrypt`): it
    /// was sealed under a key id the keyring no longer holds, it failed authentication (altered, or
    /// moved from another record), or it is no envelope at all (written without encryption). The
    /// body did not run again and the record is left as it is; permanent until the keyring is
    /// fixed (HTTP 500).
    #[error("the stored result cannot be decrypted: {reason}")]
    SnapshotDecrypt {
        /// Why it cannot be opened.
        reason: DecryptFailure,
    },
    /// The request payload used for the fingerprint could not be serialized. Nothing was written.
    #[error("the request payload cannot be fingerprinted: {reason}")]
    Fingerprint {
        /// The serializer's message.
        reason: String,
    },
    /// The submit token was spent already: a double submit (HTTP 409). Nothing was executed.
    #[error("this submit token was used already")]
    TokenUsed,
    /// The submit token cannot be spent: malformed, oversized, unknown, expired, issued to another
    /// subject, or (for `restore`) not spent (HTTP 400). Nothing changed.
    #[error("invalid submit token: {reason}")]
    TokenInvalid {
        /// What is wrong with it.
        reason: String,
    },
    /// No store (or, for `#[consume_token]`, no token store) was registered under this name.
    /// Nothing was executed.
    /// Its message says which registered name is closest ("did you mean `pg`?") and which are
    /// registered, as they are when the message is shown.
    #[error(
        "no store is registered as `{name}`{}; register one at start-up with `idem::register_store(\"{name}\", store)` (a token store: `idem::register_tokens(\"{name}\", tokens)`)",
        crate::registry::unknown_store_hint(name)
    )]
    UnknownStore {
        /// The name asked for.
        name: String,
    },
    /// The store cannot do what was asked (a memory store has no database to run a state
    /// transition in). A mistake of the service's setup (HTTP 500); nothing was written.
    #[error("the {backend} store does not support {what}")]
    NotSupported {
        /// The store's backend.
        backend: &'static str,
        /// What was asked of it.
        what: &'static str,
    },
    /// The store could not be reached, or the connection to it was lost (HTTP 503). A retry can
    /// succeed; nothing was claimed.
    #[error("the idempotency store is unavailable: {source}")]
    StoreUnavailable {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store is contended: a lock held elsewhere, a lock wait that timed out, a deadlock or a
    /// serialization failure. Transient: idem retries it where that is safe, and a later retry of
    /// the call can succeed.
    #[error("the idempotency store is busy ({reason}): {source}")]
    StoreBusy {
        /// What kind of contention.
        reason: Busy,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store's table or columns are missing or outdated; `hint` says how to fix it (usually:
    /// run the store's `migrate()` at start-up). Permanent until fixed.
    #[error("the idempotency store is not set up: {hint} ({source})")]
    StoreSchema {
        /// What to do.
        hint: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store answered with an error (a constraint, bad data, anything else permanent) or with
    /// data idem did not write.
    #[error("the idempotency store failed: {source}")]
    Store {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
}

/// The kinds of contention behind [`IdemError::StoreBusy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Busy {
    /// The database (or a row) is locked by another connection (SQLite `SQLITE_BUSY` /
    /// `SQLITE_LOCKED`), or the server is held by other work that ends by itself (Redis `BUSY`: a
    /// script runs; `TRYAGAIN`: a slot is being moved).
    Locked,
    /// A lock wait ran out of time (MySQL 1205, Postgres `55P03`), or a statement limit or an
    /// operator cut the statement off before it finished (Postgres `57014`, MariaDB 1969, MySQL
    /// 3024, a killed query 1317): nothing was changed. A claim cut off this way answers
    /// `InProgress`.
    LockTimeout,
    /// The database chose this statement as a deadlock victim (MySQL 1213, Postgres `40P01`).
    Deadlock,
    /// A serializable transaction could not be ordered (Postgres `40001`).
    Serialization,
}

/// Why [`IdemError::SnapshotDecrypt`] could not open a stored snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecryptFailure {
    /// It was sealed under a key id the keyring does not hold (a key retired too early).
    UnknownKey {
        /// The key id in the snapshot's header.
        key_id: u32,
    },
    /// The ciphertext or its header was altered, or it belongs to another `(biz, key)` record.
    Authentication,
    /// The bytes are no envelope: written before encryption was turned on, or by something else.
    NotAnEnvelope,
    /// An envelope of a format version this build does not know.
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
}

impl std::fmt::Display for DecryptFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecryptFailure::UnknownKey { key_id } => write!(
                f,
                "it was encrypted under key id {key_id}, which the keyring does not hold; keep that \
                 key with `Keyring::with_old({key_id}, key)` until its records have expired"
            ),
            DecryptFailure::Authentication => f.write_str(
                "authentication failed: the stored bytes were altered or belong to another record",
            ),
            DecryptFailure::NotAnEnvelope => f.write_str(
                "it is not an encrypted envelope (written without encryption, or by something else)",
            ),
            DecryptFailure::UnsupportedVersion { version } => write!(
                f,
                "its envelope has format version {version}, which this build of idem cannot read"
            ),
        }
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Busy::Locked => "locked",
            Busy::LockTimeout => "lock wait timeout",
            Busy::Deadlock => {
                "deadlock; the database rolled the transaction back: run it again \
                 (idem::retry_transaction)"
            }
            Busy::Serialization => {
                "serialization failure; the transaction must run again (idem::retry_transaction)"
            }
        })
    }
}

impl IdemError {
    /// Whether the same call may succeed if retried later: in progress, lease lost (the retry
    /// replays the attempt that took over, or waits for it), store unavailable or busy.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            IdemError::InProgress { .. }
                | IdemError::LeaseLost { .. }
                | IdemError::StoreUnavailable { .. }
                | IdemError::StoreBusy { .. }
        )
    }

    /// The HTTP status a service would answer with: 409 in progress, lease lost, deadlock or
    /// serialization failure (a conflict with a concurrent request: retry); 422 payload mismatch;
    /// 410 a result no longer kept; 400 bad key, biz or payload; 503 store unavailable, locked or out of lock-wait time;
    /// 500 otherwise (the service's own mistakes and permanent store errors).
    pub fn http_status(&self) -> u16 {
        match self {
            IdemError::InProgress { .. } | IdemError::LeaseLost { .. } | IdemError::TokenUsed => {
                409
            }
            IdemError::StoreBusy {
                reason: Busy::Deadlock | Busy::Serialization,
                ..
            } => 409,
            IdemError::PayloadMismatch => 422,
            IdemError::ResultExpired => 410,
            IdemError::InvalidKey { .. }
            | IdemError::InvalidBiz { .. }
            | IdemError::Fingerprint { .. }
            | IdemError::TokenInvalid { .. } => 400,
            IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. } => 503,
            _ => 500,
        }
    }

    /// Whether the database rolled the whole transaction back (a deadlock victim, a serialization
    /// failure): in transaction mode, run the transaction again from its `begin()`
    /// ([`crate::retry_transaction`] does that).
    pub fn restarts_transaction(&self) -> bool {
        matches!(
            self,
            IdemError::StoreBusy {
                reason: Busy::Deadlock | Busy::Serialization,
                ..
            }
        )
    }

    /// Wraps a backend error as [`IdemError::Store`].
    pub fn store(source: impl Into<BoxError>) -> Self {
        IdemError::Store {
            source: source.into(),
        }
    }

    /// Names the step of idem's protocol a permanent store error came from (`"claim"`,
    /// `"mark"`, …), so that `Display` reads "the idempotency store failed: during the claim,
    /// Postgres error 23502: …" rather than like a statement of the caller's own. Other errors
    /// are returned as they are; one already named keeps its step.
    pub(crate) fn during(self, step: &'static str) -> Self {
        let named = |source: BoxError| -> BoxError {
            if source.is::<During>() {
                source
            } else {
                Box::new(During { step, source })
            }
        };
        match self {
            IdemError::Store { source } => IdemError::Store {
                source: named(source),
            },
            IdemError::StoreSchema { hint, source } => IdemError::StoreSchema {
                hint,
                source: named(source),
            },
            other => other,
        }
    }

    /// Wraps a backend error as [`IdemError::StoreUnavailable`].
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        IdemError::StoreUnavailable {
            source: source.into(),
        }
    }

    /// Wraps a backend error as [`IdemError::StoreBusy`].
    pub fn busy(reason: Busy, source: impl Into<BoxError>) -> Self {
        IdemError::StoreBusy {
            reason,
            source: source.into(),
        }
    }

    /// Whether this is a transient store failure (busy or unavailable) that idem may retry by
    /// itself where repeating the step is safe.
    pub(crate) fn is_transient_store_error(&self) -> bool {
        matches!(
            self,
            IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. }
        )
    }
}

/// A store error with the step of idem's protocol it came from (see `IdemError::during`).
#[derive(Debug)]
struct During {
    step: &'static str,
    source: BoxError,
}

impl std::fmt::Display for During {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "during the {}, {}", self.step, self.source)
    }
}

impl std::error::Error for During {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
