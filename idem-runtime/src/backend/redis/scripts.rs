//! The Lua scripts of the Redis store: the claim decision table (docs/DESIGN.md, *The claim
//! decision table*), each step one script on one key (one hash slot), timed by Redis `TIME` inside
//! the script, never by the client's clock.
//!
//! A record is a hash: `s` status, `a` attempt, `f` fence, `fp` fingerprint (`""` or
//! absent: none; a new record claimed without one is written without it), `lu`
//! lease end and `ex` expiry (ms, store clock), `r` result (or, until a success, the saved steps),
//! `rx` (only on a success marked with a result ttl) until when `r` is replayed: from then the
//! record is a tombstone, and once its `r` is dropped (by a claim that met it, or a sweep) `rx` is
//! 0. A success kept as long as its record (no result ttl) whose expiry is no earlier than its
//! lease end holds its result in `d` instead of `r`, after its fingerprint's digest and a newline
//! (`<digest>\n<result>`, the digest empty for none): such a record is live while its key exists,
//! so a replay is one `HGET` of `d`, decided without the clock (`read.rs`). Records marked before
//! `d` existed keep their result in `r`; every script reads either. The key expires (`PEXPIREAT`)
//! at the later of `ex` and `lu`: a live lease is never cut by the TTL. The store clock is Redis time plus
//! the test clock's offset (`ARGV` last); the key's real expiry leaves the offset out.
//!
//! On one server (not on a cluster) every record that is PROCESSING is also a member of its
//! business type's stuck index, `KEYS[2]` of every script that changes a status or a lease: a sorted
//! set `<prefix>stuck:<n>:<biz>` (see `stuck_key`) whose members are record keys scored by their
//! `lu`. A script that makes a record PROCESSING or moves its lease adds it (`ZADD`, the new `lu`),
//! one that finishes or deletes it removes it (`ZREM`), in the same script: the index is exact but
//! for records Redis expired by itself (`PEXPIREAT`), which [`STUCK`] drops when it meets them. A
//! cluster sends no `KEYS[2]` (the index would lie in another slot) and the scripts skip it. Numbers are
//! written with `%d` (Lua's own number-to-string keeps 14 digits; a fence in µs has 16): every number
//! here is an integer well under 2^53, exact in a Lua double, and Lua 5.1 formats `%d` as a C `long`,
//! which costs less than half of `%.0f` (glibc's floating-point printing) inside Redis.

/// The clock every script that writes times reads: Redis `TIME` plus the test clock's offset
/// (`ARGV` last), in µs and ms, and `fmt` (`string.format`) for numbers. No function is defined
/// here: a script defines its functions again on every run, each a closure for Lua to make and
/// collect, so the scripts of every call (a claim, a mark) define none. The texts become numbers
/// by Lua's arithmetic on them, not by `tonumber` calls, which cost more inside Redis.
macro_rules! clock {
    () => {
        r#"
local t = redis.call('TIME')
local offset = ARGV[#ARGV] + 0
local now_us = t[1] * 1000000 + t[2] + offset * 1000
local now = math.floor(now_us / 1000)
local fmt = string.format
"#
    };
}

/// `clock!` and `num(x)`, a number as the text the record keeps, for the scripts that do not
/// run on every call.
macro_rules! prelude {
    () => {
        concat!(
            clock!(),
            r#"
local function num(x) return fmt('%d', x) end
"#
        )
    };
}

/// Sets the key's expiry (`PEXPIREAT`) to the later of the record's expiry and lease end, less the
/// offset: Lua code that reads the locals named by `$ex` and `$lu` (numbers) and `$exs` and `$lus`
/// (their texts as written to the record). With no offset one of the texts is sent as it is (each
/// number formatted costs Redis about 0.25 µs), as [`key_expiry_plain!`] does.
macro_rules! key_expiry {
    ($ex:literal, $exs:literal, $lu:literal, $lus:literal) => {
        concat!(
            "if offset ~= 0 then\n  redis.call('PEXPIREAT', key, fmt('%d', math.max(",
            $ex,
            ", ",
            $lu,
            ") - offset))\nelse\n",
            key_expiry_plain!($ex, $exs, $lu, $lus),
            "end\n"
        )
    };
}

/// [`key_expiry!`] for a script that runs with no offset: the later of the two texts.
macro_rules! key_expiry_plain {
    ($ex:literal, $exs:literal, $lu:literal, $lus:literal) => {
        concat!(
            "if ",
            $ex,
            " >= ",
            $lu,
            " then\n  redis.call('PEXPIREAT', key, ",
            $exs,
            ")\nelse\n  redis.call('PEXPIREAT', key, ",
            $lus,
            ")\nend\n"
        )
    };
}

/// The claim of one record, as Lua code that reads the locals `key` (the record's key), `index`
/// (its stuck index, `nil` on a cluster), `fp` (the fingerprint, `""` for none; two are the same
/// request when their digests, the text after the last space, are equal), `lease` and `ttl` (ms),
/// and returns: the fence alone (an integer reply) for a fresh claim (attempt 1), the first
/// execution's reply, which a client reads as one value rather than an array; `{'A', attempt,
/// fence, how}` for a retry or a takeover (attempt and fence as integer replies: no formatting);
/// `{'R', result}`, `{'G'}` (a tombstone: its result is no longer kept, and is dropped now if it
/// was still there), `{'M'}` or `{'P', ms left}`. [`CLAIM`] runs it as the
/// script's body, [`CLAIM_MANY`] as a function's, once per key. `r` (or `d`, after its digest and
/// a newline) holds the result of a SUCCEEDED record, `r` the saved steps of an unfinished one: a
/// takeover, and a retry of the same payload, keep the steps; a new life deletes `r` (and `d`). A
/// new record has no `r` to delete, so the `HDEL` runs only when there is one: each `redis.call`
/// is a command Redis dispatches. A claim that takes the record puts it in the index with its new
/// lease end (`ZADD` adds or moves it). The decision sets what the claim takes (`attempt`,
/// `fence`, `expire`, `how`, and whether it `keep`s the steps); one write takes it.
macro_rules! claim_body {
    () => {
        concat!(
            r#"
local rec = redis.call('HMGET', key, 's', 'a', 'f', 'fp', 'lu', 'ex', 'r', 'rx', 'd')
local s = rec[1]
local attempt, fence, expire, how, keep
if not s then
  attempt, fence, expire, how = 1, now_us, now + ttl, 'fresh'
else
  local a, f, lu, ex = tonumber(rec[2]), tonumber(rec[3]), tonumber(rec[5]), tonumber(rec[6])
  fence = math.max(f + 1, now_us)
  if ex <= now and not (s == 'PROCESSING' and lu > now) then
    attempt, expire, how = 1, now + ttl, 'fresh'
  else
    local same = (not rec[4] or rec[4] == '' or fp == ''
      or string.match(rec[4], '[^ ]*$') == string.match(fp, '[^ ]*$'))
    if s == 'FAILED' then
      attempt, expire, how, keep = a + 1, math.max(ex, now + lease), 'retry', same
    elseif s == 'SUCCEEDED' then
      if not same then return {'M'} end
      if rec[8] and tonumber(rec[8]) <= now then
        if rec[7] then
          redis.call('HDEL', key, 'r')
          redis.call('HSET', key, 'rx', '0')
        end
        return {'G'}
      end
      local i = rec[9] and string.find(rec[9], '\n', 1, true)
      if i then return {'R', string.sub(rec[9], i + 1)} end
      return {'R', rec[7] or ''}
    else
      if not same then return {'M'} end
      if lu > now then return {'P', fmt('%d', lu - now)} end
      attempt, expire, how, keep = a + 1, math.max(ex, now + lease), 'takeover', true
    end
  end
end
local lu = now + lease
local lus, exs = fmt('%d', lu), fmt('%d', expire)
if s or fp ~= '' then
  redis.call('HSET', key, 's', 'PROCESSING', 'a', fmt('%d', attempt), 'f', fmt('%d', fence),
    'fp', fp, 'lu', lus, 'ex', exs)
else
  redis.call('HSET', key, 's', 'PROCESSING', 'a', '1', 'f', fmt('%d', fence), 'lu', lus, 'ex', exs)
end
if rec[7] and not keep then redis.call('HDEL', key, 'r') end
if rec[8] then redis.call('HDEL', key, 'rx') end
if rec[9] then redis.call('HDEL', key, 'd') end
"#,
            key_expiry!("expire", "exs", "lu", "lus"),
            r#"if index then redis.call('ZADD', index, lus, key) end
if how == 'fresh' then return fence end
return {'A', attempt, fence, how}
"#
        )
    };
}

/// `KEYS[1]` the record, `KEYS[2]` its stuck index (none on a cluster) and, on a process's first
/// claim under the business type, `KEYS[3]` the registry of stuck indexes (`<prefix>indexes`),
/// which the stuck index joins; ARGV: fingerprint, lease ms, ttl ms, offset ms. The reply is
/// `claim_body!`'s (above).
pub const CLAIM: &str = concat!(
    clock!(),
    r#"
if KEYS[3] then redis.call('SADD', KEYS[3], KEYS[2]) end
local key, index, fp, lease, ttl = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
"#,
    claim_body!()
);

/// A batch claim: `KEYS[1..n]` the records (distinct, one hash slot on a cluster), then on one
/// server their business type's stuck index and, on a process's first claim under it, the
/// registry; ARGV: `n`, the `n` fingerprints, lease ms, ttl ms, offset ms. Each record is
/// claimed as [`CLAIM`] claims one, in order, at one clock reading; the reply is the list of
/// their replies.
pub(super) const CLAIM_MANY: &str = concat!(
    clock!(),
    "local function claim(key, index, fp, lease, ttl)\n",
    claim_body!(),
    r#"end
local n = tonumber(ARGV[1])
local lease, ttl = tonumber(ARGV[n + 2]), tonumber(ARGV[n + 3])
local index = KEYS[n + 1]
if KEYS[n + 2] then redis.call('SADD', KEYS[n + 2], index) end
local out = {}
for i = 1, n do out[i] = claim(KEYS[i], index, ARGV[i + 1], lease, ttl) end
return out
"#
);

/// The mark of one record, as Lua code that reads the locals `key`, `stuck` and `results` (its
/// stuck index and results index, `nil` for none), `fence`, `result`, `ttl` and `rttl` (ms, `""`:
/// the result is kept as long as the record), and returns 1 when the record was PROCESSING under
/// the fence (or is already SUCCEEDED under it), else 0. [`COMPLETE`] runs it as the script's
/// body, [`COMPLETE_MANY`] as a function's, once per record. A success kept as long as its
/// record, with its expiry no earlier than its lease end, puts its result in `d` after its
/// fingerprint's digest (and drops the saved steps in `r`, if any); any other keeps it in `r`.
macro_rules! complete_body {
    () => {
        concat!(
            complete_write!(),
            r#"if rttl ~= '' then
  local rx = fmt('%d', now + tonumber(rttl))
  redis.call('HSET', key, 'rx', rx)
  if results then redis.call('ZADD', results, rx, key) end
end
"#,
            key_expiry!("ex", "exs", "lu", "rec[3]"),
            r#"if stuck then redis.call('ZREM', stuck, key) end
return 1
"#
        )
    };
}

/// What every mark of one record does first, as Lua code that reads the locals `key`, `fence`,
/// `result`, `ttl` and `rttl` (see [`complete_body!`]): checks the fence and the status (returning
/// 1 or 0 when the record is not PROCESSING under the fence), sets the locals `rec` (its fields),
/// `lu`, `ex` and `exs` (its lease end, and its new expiry as a number and as text), and writes
/// the success with its result.
macro_rules! complete_write {
    () => {
        r#"
local rec = redis.call('HMGET', key, 's', 'f', 'lu', 'ex', 'fp', 'r')
if rec[2] ~= fence then return 0 end
local s = rec[1]
if s ~= 'PROCESSING' then
  if s == 'SUCCEEDED' then return 1 end
  return 0
end
local lu, ex = tonumber(rec[3]), now + tonumber(ttl)
local was = tonumber(rec[4])
if was > ex then ex = was end
local exs = fmt('%d', ex)
local fp, dg = rec[5], ''
if fp and fp ~= '' then
  dg = string.match(fp, '[^ ]*$')
  if string.find(dg, '\n', 1, true) then dg = nil end
end
if dg and rttl == '' and ex >= lu then
  redis.call('HSET', key, 's', 'SUCCEEDED', 'd', dg .. '\n' .. result, 'ex', exs)
  if rec[6] then redis.call('HDEL', key, 'r') end
else
  redis.call('HSET', key, 's', 'SUCCEEDED', 'r', result, 'ex', exs)
end
"#
    };
}

/// `KEYS[1]` the record, then its stuck index (one server only), then with a result ttl the results
/// index of its slot (`[record, stuck, results]` on one server, `[record, results]` on a cluster);
/// ARGV: fence, result, ttl ms, result ttl ms (`""`: the result is kept as long as the record),
/// offset. 1 when the record was PROCESSING under the fence
/// (or is already SUCCEEDED under it: a mark sent again after a lost reply, which changes nothing).
/// The mark moves `ex` to at least now + ttl, and the key's expiry with it, so a body slower than
/// its ttl still leaves a live success, and takes the record out of the stuck index. A result
/// kept for less than its record enters the results index, scored by `rx`, where the shrink
/// script finds it when that time comes.
pub const COMPLETE: &str = concat!(
    clock!(),
    r#"
local results, stuck
if ARGV[4] ~= '' and #KEYS >= 2 then results = KEYS[#KEYS] end
if #KEYS == 3 or (#KEYS == 2 and not results) then stuck = KEYS[2] end
local key, fence, result, ttl, rttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
"#,
    complete_body!()
);

/// [`COMPLETE`] on one server with no test clock's offset and no result ttl, the mark of every
/// call in production: `KEYS[1]` the record, `KEYS[2]` its stuck index; ARGV: fence, result, ttl
/// ms (and the offset, 0, which it does not read). The same mark with nothing of the offset, the
/// result ttl or a cluster to decide: each Lua step costs inside Redis, on every first execution.
pub const COMPLETE_PLAIN: &str = concat!(
    r#"
local t = redis.call('TIME')
local now = math.floor((t[1] * 1000000 + t[2]) / 1000)
local fmt = string.format
local key, fence, result, ttl, rttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ''
"#,
    complete_write!(),
    key_expiry_plain!("ex", "exs", "lu", "rec[3]"),
    r#"redis.call('ZREM', KEYS[2], key)
return 1
"#
);

/// A batch of marks: `KEYS[1..n]` the records (distinct, one hash slot on a cluster), then the
/// stuck index of their business type (one server) when ARGV[2] is `1`, then their results index
/// when ARGV[3] is `1`; ARGV: `n`, those two flags, ttl ms, then per record its fence, result and
/// result ttl ms (`""`: kept as long as the record), then the offset. Each record is marked as
/// [`COMPLETE`] marks one, at one clock reading; the reply is the list of their answers (1 or 0).
pub(super) const COMPLETE_MANY: &str = concat!(
    clock!(),
    "local function complete(key, stuck, results, fence, result, ttl, rttl)\n",
    complete_body!(),
    r#"end
local n = tonumber(ARGV[1])
local k, stuck, results = n, nil, nil
if ARGV[2] == '1' then k = k + 1; stuck = KEYS[k] end
if ARGV[3] == '1' then k = k + 1; results = KEYS[k] end
local out = {}
for i = 1, n do
  local a = 4 + (i - 1) * 3
  out[i] = complete(KEYS[i], stuck, results, ARGV[a + 1], ARGV[a + 2], ARGV[4], ARGV[a + 3])
end
return out
"#
);

/// KEYS[1] the record, `KEYS[2]` its stuck index (none on a cluster); ARGV: fence, offset. 1 when
/// the record was PROCESSING under the fence (or is already FAILED under it); it leaves the index.
/// The saved steps (`r`) stay for a retry.
pub(super) const FAIL: &str = r#"
local rec = redis.call('HMGET', KEYS[1], 's', 'f')
if rec[2] ~= ARGV[1] then return 0 end
if rec[1] == 'FAILED' then return 1 end
if rec[1] ~= 'PROCESSING' then return 0 end
redis.call('HSET', KEYS[1], 's', 'FAILED')
if KEYS[2] then redis.call('ZREM', KEYS[2], KEYS[1]) end
return 1
"#;

/// KEYS[1] the record (`KEYS[2]`, its stuck index, is not touched); ARGV: fence, steps, offset.
/// 1 when the record is PROCESSING under the fence: its saved steps (`r`, until a success
/// replaces them with the result) are now `steps`.
pub(super) const SAVE_STEPS: &str = r#"
local rec = redis.call('HMGET', KEYS[1], 's', 'f')
if rec[1] ~= 'PROCESSING' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'r', ARGV[2])
return 1
"#;

/// KEYS[1] the record, `KEYS[2]` its stuck index (none on a cluster); ARGV: fence, lease ms,
/// offset. Extends a held lease and the record's life with it, and moves the record in the index
/// to its new lease end.
pub(super) const RENEW: &str = concat!(
    prelude!(),
    r#"
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'ex')
if rec[1] ~= 'PROCESSING' or rec[2] ~= ARGV[1] then return 0 end
local lu = now + tonumber(ARGV[2])
local ex = math.max(tonumber(rec[3]), lu)
redis.call('HSET', KEYS[1], 'lu', num(lu), 'ex', num(ex))
redis.call('PEXPIREAT', KEYS[1], num(ex - offset))
if KEYS[2] then redis.call('ZADD', KEYS[2], num(lu), KEYS[1]) end
return 1
"#
);

/// KEYS[1] the record, `KEYS[2]` its stuck index (none on a cluster); ARGV: offset. Deletes the
/// record if it expired by the store clock (TTL passed and no live lease): Redis expires keys by
/// itself, this only matters when a test clock runs ahead. Drops the result of a success whose
/// result ttl passed (the record stays, a tombstone). 1 when it deleted or dropped anything. What
/// a sweep runs on each key it walks, which it does only under a test clock that moved (otherwise
/// [`SHRINK`] does a sweep's work from the results indexes).
pub(super) const SWEEP: &str = concat!(
    prelude!(),
    r#"
local rec = redis.call('HMGET', KEYS[1], 's', 'lu', 'ex', 'rx')
if not rec[1] then return 0 end
local live = (rec[1] == 'PROCESSING' and tonumber(rec[2]) > now)
if tonumber(rec[3]) <= now and not live then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('ZREM', KEYS[2], KEYS[1]) end
  return 1
end
local rx = tonumber(rec[4])
if rec[1] == 'SUCCEEDED' and rx and rx > 0 and rx <= now then
  redis.call('HDEL', KEYS[1], 'r')
  redis.call('HSET', KEYS[1], 'rx', '0')
  return 1
end
return 0
"#
);

/// KEYS[1] a stuck index; ARGV: want, skip, budget, offset. Walks the members whose score (lease
/// end) is at most now, oldest first, passing over the first `skip`, and reads each one's record
/// (the members are record keys: this script runs on one server only, never on a cluster). A
/// record PROCESSING with `lu <= now` is stuck and stays; a member whose record is gone (Redis
/// expired it) or not PROCESSING is removed, and one whose lease is later than its score is moved
/// to it (neither happens while every writer runs these scripts, but for the expiry). It stops
/// after `want` stuck records (`want` 0: none are wanted, the walk only drops stale members), at
/// the end of the range, or after `budget` members.
///
/// Returns `{more, kept, member, s, a, f, fp, lu, ex, r, rx, member, …}`: `more` 1 when it stopped at
/// the budget (there may be more to walk), `kept` how many stuck records it passed, then (`want`
/// > 0) each one's key and its fields in `load`'s order (`r` its saved steps, if any).
pub(super) const STUCK: &str = concat!(
    prelude!(),
    r#"
local want, skip, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {0, 0}
local kept, seen = 0, 0
while seen < budget do
  local chunk = math.min(budget - seen, 256)
  if want > 0 then chunk = math.min(chunk, want - kept) end
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', num(skip + kept),
    num(chunk))
  if #members == 0 then
    out[2] = kept
    return out
  end
  for _, m in ipairs(members) do
    seen = seen + 1
    local rec = redis.call('HMGET', m, 's', 'a', 'f', 'fp', 'lu', 'ex', 'r', 'rx')
    local lu = tonumber(rec[5])
    if rec[1] == 'PROCESSING' and lu and lu <= now then
      kept = kept + 1
      if want > 0 then
        out[#out + 1] = m
        for i = 1, 8 do out[#out + 1] = rec[i] end
        if kept == want then
          out[2] = kept
          return out
        end
      end
    elseif rec[1] == 'PROCESSING' and lu then
      redis.call('ZADD', KEYS[1], num(lu), m)
    else
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
out[1] = 1
out[2] = kept
return out
"#
);

/// KEYS[1] a results index (`<prefix>results` on one server, `<prefix>results{<tag>}` per slot on
/// a cluster: a sorted set of record keys scored by their `rx`, written by [`COMPLETE`]); ARGV:
/// want, budget, offset. Walks the members whose result expiry has come, oldest first, at most
/// `budget` of them, and drops the result of each record still SUCCEEDED under that expiry (the
/// record stays, a tombstone with `rx` 0), at most `want` of them. Every member walked leaves the
/// index, but for one whose record was marked again with a later expiry, which moves to it. The
/// members are record keys, in the index's slot on a cluster.
///
/// Returns `{dropped, more}`: `more` 1 when it stopped at `want` or at the budget (there may be
/// more members whose time has come).
pub(super) const SHRINK: &str = concat!(
    prelude!(),
    r#"
local want, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', 0, num(budget))
local dropped = 0
for i, m in ipairs(members) do
  if dropped == want then return {dropped, 1} end
  local rec = redis.call('HMGET', m, 's', 'rx', 'r')
  local rx = tonumber(rec[2])
  if rx and rx > now then
    redis.call('ZADD', KEYS[1], num(rx), m)
  else
    redis.call('ZREM', KEYS[1], m)
    if rec[1] == 'SUCCEEDED' and rx and rx > 0 then
      if rec[3] then redis.call('HDEL', m, 'r') end
      redis.call('HSET', m, 'rx', '0')
      dropped = dropped + 1
    end
  end
end
local more = 0
if #members == budget then more = 1 end
return {dropped, more}
"#
);
