//! One-time submit tokens: a page gets a token when it is rendered; the submit
//! that carries it consumes it with one atomic step, so a double click or a resubmitted form runs
//! the business once; `restore` puts a token back when the business failed, so the user can retry
//! without a fresh page.
//!
//! [`TokenStore`], [`MemoryTokens`], [`register_tokens`] and [`tokens`](fn@tokens) are also at the
//! crate root; [`MAX_SUBJECT_LEN`] bounds a token's subject.

mod memory;
mod registry;

use std::time::Duration;

use async_trait::async_trait;

use crate::IdemError;
/// The one-time submit tokens of every SQL store (`idem::PgTokens`, `idem::MySqlTokens` and
/// `idem::SqliteTokens` are it on their database).
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub use crate::sql::tokens::SqlTokens;
pub use memory::MemoryTokens;
pub(crate) use registry::registered_token_names;
pub use registry::{register_tokens, tokens};

/// Random bytes in a token (192 bits from the operating system's CSPRNG).
const TOKEN_BYTES: usize = 24;
/// Longest subject, in bytes.
pub const MAX_SUBJECT_LEN: usize = 128;

/// A store of one-time tokens.
///
/// Every backend keeps, per token, its subject, whether it is spent, and its expiry; a spent token
/// stays until it expires, so a second submit is told [`IdemError::TokenUsed`] rather than
/// "unknown".
///
/// A token is 192 random bits (48 hex digits). [`consume`](TokenStore::consume) spends it
/// atomically: of N concurrent consumers one wins, the rest get [`IdemError::TokenUsed`] (409);
/// [`restore`](TokenStore::restore) puts back a spent token whose business failed; an unknown,
/// expired or malformed token, or another subject's, is [`IdemError::TokenInvalid`] (400) and
/// changes nothing. Backends: [`MemoryTokens`], and `tokens()` on the SQLite (table `idem_token`
/// unless `with_token_table` names another, made by `migrate()`), MySQL, Postgres, Redis and
/// DynamoDB stores. [`register_tokens`] names one for `#[consume_token]`;
/// [`Sweeper::with_tokens`](crate::Sweeper::with_tokens) deletes expired ones.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem::IdemError> {
/// use std::time::Duration;
///
/// use idem::{IdemError, MemoryTokens, TokenStore};
///
/// let tokens = MemoryTokens::new();
/// let token = tokens.issue(Duration::from_secs(600), Some("u-42")).await?; // rendering the form
/// tokens.consume(&token, Some("u-42")).await?; // the first submit
/// let again = tokens.consume(&token, Some("u-42")).await; // the double click
/// assert!(matches!(again, Err(IdemError::TokenUsed)));
/// tokens.restore(&token, Some("u-42")).await?; // the business failed: the user may submit again
/// tokens.consume(&token, Some("u-42")).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// The backend's name: `memory`, `sqlite`, `redis`, …
    fn backend(&self) -> &'static str;

    /// Issues a fresh token, valid for `ttl`, optionally bound to a `subject` (a user or session
    /// id): only the same subject can consume it.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a `ttl` under 1 ms; [`IdemError::TokenInvalid`] for a
    /// subject over [`MAX_SUBJECT_LEN`] bytes or with NUL; store errors.
    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError>;

    /// Spends `token`, atomically: of N concurrent consumers exactly one gets `Ok`.
    ///
    /// # Errors
    /// [`IdemError::TokenUsed`] (409) for a token spent already; [`IdemError::TokenInvalid`] (400)
    /// for a malformed, oversized, unknown or expired token, or one issued to another subject.
    /// Nothing changes on an error.
    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError>;

    /// Puts back a spent token (its business failed), so it can be consumed once more.
    ///
    /// # Errors
    /// [`IdemError::TokenInvalid`] for a token that is not spent, unknown, expired, malformed or
    /// issued to another subject. Nothing changes on an error.
    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError>;

    /// Deletes at most `batch` expired tokens (a store that expires them by itself has none).
    ///
    /// # Errors
    /// Store errors.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let _ = batch;
        Ok(0)
    }
}

/// A fresh token: 24 bytes from the OS CSPRNG, as 48 lowercase hex digits (URL-safe).
pub(crate) fn new_token() -> Result<String, IdemError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| IdemError::unavailable(format!("the OS random source failed: {e}")))?;
    Ok(crate::fingerprint::hex(&bytes))
}

/// Checks a token's form before it touches the store.
pub(crate) fn check_token(token: &str) -> Result<(), IdemError> {
    let reason = if token.len() > 2 * TOKEN_BYTES {
        "the token is longer than any idem issues"
    } else if token.len() != 2 * TOKEN_BYTES
        || !token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        "the token is malformed"
    } else {
        return Ok(());
    };
    Err(IdemError::TokenInvalid {
        reason: reason.to_owned(),
    })
}

/// Checks a token's lifetime before anything is issued: 1 ms ..= [`crate::MAX_DURATION`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), IdemError> {
    crate::duration::check(
        "a token's ttl",
        ttl,
        Duration::from_millis(1),
        "shorter than 1 ms, the stores' unit of time: the token would expire before anyone could spend it",
    )
}

/// The subject as stored: `""` for none.
pub(crate) fn subject_of(subject: Option<&str>) -> Result<&str, IdemError> {
    let subject = subject.unwrap_or("");
    if subject.len() > MAX_SUBJECT_LEN || subject.contains('\0') {
        return Err(IdemError::TokenInvalid {
            reason: format!("the subject must be at most {MAX_SUBJECT_LEN} bytes, without NUL"),
        });
    }
    Ok(subject)
}

/// Why a consume or restore changed nothing, from what the store found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Unknown,
    Expired,
    OtherSubject,
    Used,
    NotUsed,
}

impl Refusal {
    pub(crate) fn error(self) -> IdemError {
        let reason = match self {
            Refusal::Used => return IdemError::TokenUsed,
            Refusal::Unknown => "the token is unknown (never issued, or expired and gone)",
            Refusal::Expired => "the token has expired",
            Refusal::OtherSubject => "the token was issued to another subject",
            Refusal::NotUsed => "the token was not spent, so there is nothing to restore",
        };
        IdemError::TokenInvalid {
            reason: reason.to_owned(),
        }
    }
}

/// A token as a store found it, for telling why a consume or restore changed nothing.
pub(crate) struct Found<'a> {
    pub subject: &'a str,
    pub live: bool,
}

/// Why a consume (`spending`) or a restore of a token for `subject` changed nothing: a live token
/// of the subject that did not change was spent already (consume) or not spent (restore).
pub(crate) fn refusal(found: Option<Found<'_>>, subject: &str, spending: bool) -> Refusal {
    match found {
        None => Refusal::Unknown,
        Some(f) if !f.live => Refusal::Expired,
        Some(f) if f.subject != subject => Refusal::OtherSubject,
        Some(_) if spending => Refusal::Used,
        Some(_) => Refusal::NotUsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_checked() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 48);
        assert!(check_token(&a).is_ok());
        for bad in ["", "xyz", &a[..47], &a.to_uppercase()] {
            assert!(
                matches!(check_token(bad), Err(IdemError::TokenInvalid { .. })),
                "{bad}"
            );
        }
        let long = format!("{a}00");
        assert!(
            matches!(check_token(&long), Err(IdemError::TokenInvalid { reason }) if reason.contains("longer"))
        );
        assert!(subject_of(Some(&"u".repeat(129))).is_err());
        assert_eq!(subject_of(None).unwrap(), "");
    }
}
