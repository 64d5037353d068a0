//! One-time submit tokens in Redis: one hash per token under `<prefix>tok:<token>` (`sub`
//! subject, `sp` spent flag, `ex` expiry in ms by the store clock), expiring by itself
//! (`PEXPIREAT`). Consume and restore are one Lua script each, so the check and the flip are one
//! step on one key.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::{Records, RedisClusterStore, RedisStore, int, redis_error, text};
use crate::IdemError;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// The store clock (Redis `TIME` plus the test clock's offset, `ARGV` last) in ms.
macro_rules! clock {
    () => {
        r#"
local t = redis.call('TIME')
local offset = tonumber(ARGV[#ARGV])
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000) + offset
"#
    };
}

/// KEYS[1] the token; ARGV: subject, ttl ms, offset. 1 when issued (0: the key exists already).
const ISSUE: &str = concat!(
    clock!(),
    r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ex = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'sub', ARGV[1], 'sp', '0', 'ex', string.format('%.0f', ex))
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', ex - offset))
return 1
"#
);

/// KEYS[1] the token; ARGV: subject, the spent flag it must have, the one it gets, offset.
/// Returns 1 when flipped; otherwise what was found: `{}` (nothing) or `{subject, live}`.
const FLIP: &str = concat!(
    clock!(),
    r#"
local rec = redis.call('HMGET', KEYS[1], 'sub', 'sp', 'ex')
if not rec[1] then return {} end
local live = tonumber(rec[3]) > now
if live and rec[1] == ARGV[1] and rec[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'sp', ARGV[3])
  return 1
end
return {rec[1], live and 1 or 0}
"#
);

static ISSUE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ISSUE));
static FLIP_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FLIP));

/// One-time submit tokens in Redis ([`RedisStore::tokens`], [`RedisClusterStore::tokens`]). They
/// expire by themselves; durability is the server's (see `docs/RELIABILITY.md`).
#[derive(Clone)]
pub struct RedisTokens {
    records: Records,
}

impl RedisStore {
    /// One-time submit tokens on this store's server, under its key prefix (`<prefix>tok:…`).
    pub fn tokens(&self) -> RedisTokens {
        RedisTokens {
            records: (*self.records).clone(),
        }
    }
}

impl RedisClusterStore {
    /// One-time submit tokens on this cluster, under the store's key prefix.
    pub fn tokens(&self) -> RedisTokens {
        self.0.tokens()
    }
}

impl RedisTokens {
    fn key(&self, token: &str) -> String {
        format!("{}tok:{token}", self.records.prefix)
    }

    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let mut conn = self.records.conn.clone();
        let key = self.key(token);
        let reply: Value = FLIP_SCRIPT
            .key(&key)
            .arg(subject)
            .arg(if to { "0" } else { "1" })
            .arg(if to { "1" } else { "0" })
            .arg(self.records.offset.ms())
            .invoke_async(&mut conn)
            .await
            .map_err(redis_error)?;
        let found = match &reply {
            Value::Int(1) => return self.records.replicated(&key).await,
            Value::Array(v) if v.is_empty() => None,
            Value::Array(v) => match v.as_slice() {
                [sub, live] => Some((text(sub).unwrap_or_default(), int(live, "live")? == 1)),
                _ => None,
            },
            _ => {
                return Err(IdemError::store(format!(
                    "unexpected reply from the token script: {reply:?}"
                )));
            }
        };
        let found = found.as_ref().map(|(subject, live)| Found {
            subject,
            live: *live,
        });
        Err(refusal(found, subject, to).error())
    }
}

#[async_trait]
impl TokenStore for RedisTokens {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let ttl = millis(ttl).max(1);
        let mut conn = self.records.conn.clone();
        // 192 random bits never collide in practice; the script still refuses to overwrite.
        for _ in 0..3 {
            let token = new_token()?;
            let issued: i64 = ISSUE_SCRIPT
                .key(self.key(&token))
                .arg(subject)
                .arg(ttl)
                .arg(self.records.offset.ms())
                .invoke_async(&mut conn)
                .await
                .map_err(redis_error)?;
            if issued == 1 {
                self.records.replicated(&self.key(&token)).await?;
                return Ok(token);
            }
        }
        Err(IdemError::store(
            "could not issue a token that is not taken",
        ))
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true).await
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false).await
    }
}
