//! Tokens in this process's memory, for tests and single-process services.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};
use crate::IdemError;
use crate::clock::ClockOffset;

struct Entry {
    subject: String,
    spent: bool,
    expire_at: Instant,
}

/// One-time tokens kept in this process's memory (lost when it ends).
#[derive(Default)]
pub struct MemoryTokens {
    tokens: Mutex<HashMap<String, Entry>>,
    offset: ClockOffset,
}

impl MemoryTokens {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`).
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(mut self, clock: crate::clock::TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    fn now(&self) -> Instant {
        Instant::now() + Duration::from_millis(u64::try_from(self.offset.ms()).unwrap_or(0))
    }

    /// Turns the token's `spent` flag from `!to` to `to`, if it is live and the subject's.
    fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let now = self.now();
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        match tokens.get_mut(token) {
            Some(e) if e.expire_at > now && e.subject == subject && e.spent != to => {
                e.spent = to;
                Ok(())
            }
            found => Err(refusal(
                found.map(|e| Found {
                    subject: &e.subject,
                    live: e.expire_at > now,
                }),
                subject,
                to,
            )
            .error()),
        }
    }
}

#[async_trait]
impl TokenStore for MemoryTokens {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?.to_owned();
        let token = new_token()?;
        let expire_at = self.now() + ttl;
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                token.clone(),
                Entry {
                    subject,
                    spent: false,
                    expire_at,
                },
            );
        Ok(token)
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true)
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false)
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let now = self.now();
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let expired: Vec<String> = tokens
            .iter()
            .filter(|(_, e)| e.expire_at <= now)
            .map(|(t, _)| t.clone())
            .take(batch)
            .collect();
        for t in &expired {
            tokens.remove(t);
        }
        Ok(expired.len() as u64)
    }
}
