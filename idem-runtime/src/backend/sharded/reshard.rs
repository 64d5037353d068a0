//! Moving a sharded store from one list of shards to another while it serves: the steps of the
//! layout, written one after another with a settle time between them, and the copy of the
//! moving keys' records.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ShardedStore;
use super::layout::{self, Layout, Phase};
use super::moving::give_back;
use super::route;
use super::view::STALE_AFTER;
use crate::IdemError;
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Record, Status, Store};

/// Where a reshard stands, as [`Reshard::run`] reports it after each step and each page copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReshardProgress {
    /// The layout step written last (0: none yet).
    pub step: u64,
    /// Its phase.
    pub phase: Option<Phase>,
    /// What the tool is doing, for people.
    pub doing: String,
    /// Records of moving keys walked so far.
    pub walked: u64,
    /// Of those, copied to their new shard.
    pub copied: u64,
    /// Moving keys whose record is in progress on the old shard under a claim of a holder that
    /// has none on the new shard: the copy waits for them to finish (or their lease to end).
    pub waiting: u64,
    /// Keys whose new shard holds a success from another payload than the old shard's (kept; the
    /// old record is not copied).
    pub conflicts: u64,
}

/// Moves a [`ShardedStore`] from the shards of one store to those of another (grow, shrink or
/// replace shards), while processes on both lists serve. Run again after a failure or an
/// interruption: it goes on from where the layout says it stopped.
///
/// The steps, each written to every shard of both lists and followed by a wait of at least
/// [`STALE_AFTER`] (so that every process read it): `planned` (nothing moves yet); `dual-old`
/// and `dual-new` (a moving key is claimed on both its shards); then the copy of every moving
/// key's record to its new shard; then `done`. docs/DESIGN.md ("Resharding") gives the protocol
/// and why no key runs twice.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem_runtime::sharding::{Phase, Reshard};
/// use idem_runtime::{ShardedStore, SqliteStore};
/// let (a, b, c) = (
///     SqliteStore::open("a.db").await?,
///     SqliteStore::open("b.db").await?,
///     SqliteStore::open("c.db").await?,
/// );
/// c.migrate().await?;
/// let from = ShardedStore::new([a.clone(), b.clone()])?;
/// let to = ShardedStore::new([a, b, c])?;
/// let done = Reshard::new(&from, &to).run(|p| println!("{}", p.doing)).await?;
/// assert_eq!(done.phase, Some(Phase::Done));
/// # Ok(()) }
/// ```
pub struct Reshard<S> {
    from: ShardedStore<S>,
    to: ShardedStore<S>,
    batch: usize,
    settle: Duration,
    plan_only: bool,
}

impl<S: Store> Reshard<S> {
    /// The shortest settle time: a process's layout is at most [`STALE_AFTER`] old, plus a second
    /// for the clocks of two machines.
    pub const MIN_SETTLE: Duration = Duration::from_secs(STALE_AFTER.as_secs() + 1);
    /// The longest settle time.
    pub const MAX_SETTLE: Duration = Duration::from_secs(3600);

    /// A reshard from `from`'s shards (in its order) to `to`'s. A shard may be in both (given to
    /// each as its own connection to the same database).
    pub fn new(from: &ShardedStore<S>, to: &ShardedStore<S>) -> Self {
        Reshard {
            from: from.clone(),
            to: to.clone(),
            batch: 500,
            settle: Self::MIN_SETTLE,
            plan_only: false,
        }
    }

    /// How many keys a page of the copy walks (1 ..= [`crate::store::MAX_BATCH`]; 500 by default).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] out of that range.
    pub fn batch(mut self, batch: usize) -> Result<Self, IdemError> {
        if !(1..=crate::MAX_BATCH).contains(&batch) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a reshard's batch is 1 to {} keys, not {batch}",
                    crate::MAX_BATCH
                ),
            });
        }
        self.batch = batch;
        Ok(self)
    }

    /// How long to wait after writing a step before the next
    /// ([`Reshard::MIN_SETTLE`] ..= [`Reshard::MAX_SETTLE`]; the minimum by default).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] out of that range.
    pub fn settle(mut self, settle: Duration) -> Result<Self, IdemError> {
        if !(Self::MIN_SETTLE..=Self::MAX_SETTLE).contains(&settle) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a reshard's settle time is {:?} to {:?} (a process reads its layout at \
                     least every {STALE_AFTER:?}), not {settle:?}",
                    Self::MIN_SETTLE,
                    Self::MAX_SETTLE
                ),
            });
        }
        self.settle = settle;
        Ok(self)
    }

    /// Stops after writing the `planned` step: nothing moves, and processes given the new list
    /// keep routing over the old one until the reshard runs.
    pub fn plan_only(mut self) -> Self {
        self.plan_only = true;
        self
    }

    /// The newest layout step the shards of both lists hold, if any.
    ///
    /// # Errors
    /// A shard's error.
    pub async fn status(&self) -> Result<Option<Layout>, IdemError> {
        let all: Vec<&S> = self.from.shards().iter().chain(self.to.shards()).collect();
        layout::newest(&all, None, true).await
    }

    /// Runs the reshard to its end (or to `planned` with [`Reshard::plan_only`]), calling
    /// `progress` as it goes; returns where it stands.
    ///
    /// # Errors
    /// A shard's error (run again: it goes on where it stopped);
    /// [`IdemError::InvalidOptions`] when the shards' layout is another than this reshard's
    /// (another reshard under way, or `from` is not the list the keys are routed over).
    pub async fn run(
        &self,
        mut progress: impl FnMut(&ReshardProgress),
    ) -> Result<ReshardProgress, IdemError> {
        let mut p = ReshardProgress::default();
        // Each shard's identity, read (or given) once; the stores by identity, each once.
        let mut ids = Vec::new();
        for shard in self.from.shards().iter().chain(self.to.shards()) {
            ids.push(layout::ensure_id(shard).await?);
        }
        let to_ids = ids.split_off(self.from.shards().len());
        let from_ids = ids;
        let mut stores: Vec<(String, &S)> = Vec::new();
        let all = self.from.shards().iter().chain(self.to.shards());
        for (id, shard) in from_ids.iter().chain(&to_ids).zip(all) {
            if !stores.iter().any(|(known, _)| known == id) {
                stores.push((id.clone(), shard));
            }
        }
        let current = self.status().await?;
        let mut at = match &current {
            None => None,
            Some(l) if l.from == from_ids && l.to == to_ids => Some(l.clone()),
            Some(l) if l.phase == Phase::Done && l.to == from_ids => None,
            Some(l) => {
                return Err(IdemError::InvalidOptions {
                    reason: format!(
                        "the shards' layout (step {}, {}) routes from [{}] to [{}], not from \
                         [{}] to [{}]: finish that reshard first (run it again), or give the \
                         list the keys are routed over as `from`",
                        l.step,
                        l.phase.as_str(),
                        l.from.join(", "),
                        l.to.join(", "),
                        from_ids.join(", "),
                        to_ids.join(", ")
                    ),
                });
            }
        };
        let base = current.as_ref().map_or(0, |l| l.step);
        let by_id: HashMap<&str, &S> = stores.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        let write = |phase: Phase, step: u64| Layout {
            step,
            phase,
            from: from_ids.clone(),
            to: to_ids.clone(),
        };
        let next_phase = |at: &Option<Layout>| match at {
            None => Some(write(Phase::Planned, base + 1)),
            Some(l) => match l.phase {
                Phase::Planned => Some(write(Phase::DualOld, l.step + 1)),
                Phase::DualOld => Some(write(Phase::DualNew, l.step + 1)),
                Phase::DualNew => Some(write(Phase::Done, l.step + 1)),
                Phase::Done => None,
            },
        };
        if let Some(l) = &at {
            p.step = l.step;
            p.phase = Some(l.phase);
            if l.phase < Phase::Done {
                // Resumed: the processes may not all have read the step yet.
                self.wait(&mut p, &mut progress).await;
            }
        }
        loop {
            if at.as_ref().is_some_and(|l| l.phase == Phase::DualNew) {
                self.copy(&from_ids, &to_ids, &by_id, &mut p, &mut progress)
                    .await?;
            }
            let Some(step) = next_phase(&at) else {
                break;
            };
            self.write_step(&step, &from_ids, &stores).await?;
            p.step = step.step;
            p.phase = Some(step.phase);
            at = Some(step);
            self.wait(&mut p, &mut progress).await;
            if self.plan_only && at.as_ref().is_some_and(|l| l.phase == Phase::Planned) {
                break;
            }
        }
        p.doing = match p.phase {
            Some(Phase::Done) => "done: the window can close; every process routes over the new \
                                  shards, and the old shards' copies of the moved keys expire \
                                  with their ttl"
                .to_owned(),
            _ => "planned: run again without plan-only to move the keys".to_owned(),
        };
        progress(&p);
        Ok(p)
    }

    /// Writes `step` to the first shard of `from` (which decides between two tools writing at
    /// once), then to every other shard.
    async fn write_step(
        &self,
        step: &Layout,
        from_ids: &[String],
        stores: &[(String, &S)],
    ) -> Result<(), IdemError> {
        let bytes = step.encode();
        let key = layout::step_key(step.step);
        let first = stores
            .iter()
            .position(|(id, _)| *id == from_ids[0])
            .expect("every shard of from is a store");
        let order = std::iter::once(first).chain((0..stores.len()).filter(|i| *i != first));
        for i in order {
            let kept = layout::write_once(stores[i].1, layout::LAYOUT_BIZ, &key, &bytes).await?;
            if kept != bytes {
                return Err(IdemError::InvalidOptions {
                    reason: format!(
                        "another reshard wrote step {} of the layout at the same time: {}",
                        step.step,
                        String::from_utf8_lossy(&kept)
                    ),
                });
            }
        }
        Ok(())
    }

    async fn wait(&self, p: &mut ReshardProgress, progress: &mut impl FnMut(&ReshardProgress)) {
        p.doing = format!(
            "waiting {:?} for every process to read step {}",
            self.settle, p.step
        );
        progress(p);
        tokio::time::sleep(self.settle).await;
    }

    /// Copies the record of every key whose shard changes to its new shard, page by page, then
    /// waits for the ones in progress under a claim the new shard does not know.
    async fn copy(
        &self,
        from_ids: &[String],
        to_ids: &[String],
        by_id: &HashMap<&str, &S>,
        p: &mut ReshardProgress,
        progress: &mut impl FnMut(&ReshardProgress),
    ) -> Result<(), IdemError> {
        let mut watched: Vec<Watched<'_, S>> = Vec::new();
        let mut walked_shards: Vec<&str> = Vec::new();
        for id in from_ids {
            if walked_shards.contains(&id.as_str()) {
                continue;
            }
            walked_shards.push(id);
            let old = by_id[id.as_str()];
            let mut after: Option<String> = None;
            loop {
                let page = old.list_keys(after.as_deref(), self.batch).await?;
                for (biz, key) in &page.keys {
                    if layout::reserved(biz) {
                        continue;
                    }
                    let a = &from_ids[route::shard(biz, key, from_ids.len())];
                    let b = &to_ids[route::shard(biz, key, to_ids.len())];
                    if a != id || a == b {
                        continue;
                    }
                    p.walked += 1;
                    let new = by_id[b.as_str()];
                    if let Some(w) = copy_one(old, new, biz, key, p).await? {
                        watched.push(w);
                    }
                }
                p.waiting = watched.len() as u64;
                p.doing = format!("copying the moving keys' records (step {})", p.step);
                progress(p);
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        while !watched.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut left = Vec::new();
            for mut w in watched {
                if !w.settle(p).await? {
                    left.push(w);
                }
            }
            watched = left;
            p.waiting = watched.len() as u64;
            p.doing = format!(
                "waiting for {} moving keys in progress under their old claim",
                watched.len()
            );
            progress(p);
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch by this machine's clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `ms` from now, at least 1 ms.
fn from_now(until_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(until_ms - now_ms()).unwrap_or(0).max(1))
}

/// A moving key whose new shard holds a claim of the tool's, standing for a claim on the old
/// shard the new shard does not know (its holder claimed before the dual phases): mirrored
/// until that claim ends.
struct Watched<'s, S> {
    old: &'s S,
    new: &'s S,
    biz: String,
    key: String,
    /// The old shard's claim it stands for.
    fence: crate::Fence,
    /// The tool's claim on the new shard; `None` when another claim holds it (the record is
    /// copied again once the old shard's record ended).
    claim: Option<Claim>,
}

impl<S: Store> Watched<'_, S> {
    /// Mirrors the old shard's record: `true` once its claim ended (and the new shard says how).
    async fn settle(&mut self, p: &mut ReshardProgress) -> Result<bool, IdemError> {
        let Some(claim) = self.claim else {
            let live = self.old.load(&self.biz, &self.key).await?.is_some_and(|r| {
                r.fence == self.fence
                    && r.status == Status::Processing
                    && r.lease_until_ms > now_ms()
            });
            if live {
                return Ok(false);
            }
            return match copy_one(self.old, self.new, &self.biz, &self.key, p).await? {
                None => Ok(true),
                // Still held on the new shard, or now held by the tool: mirrored next round.
                Some(again) => {
                    *self = again;
                    Ok(false)
                }
            };
        };
        let claim = &claim;
        let (biz, key) = (self.biz.as_str(), self.key.as_str());
        let Some(r) = self.old.load(biz, key).await? else {
            // Expired on the old shard: nothing to stand for.
            return self.ended(self.new.release(biz, key, claim).await, None);
        };
        if r.fence != self.fence {
            // Taken over on the old shard (which fenced its holder out): the new claim's holder
            // also claims the new shard, where the tool's claim is given back.
            let answer = self.new.release(biz, key, claim).await;
            return self.ended(answer, Some(r.fence));
        }
        let answer = match r.status {
            Status::Processing if r.lease_until_ms > now_ms() => {
                let lease = from_now(r.lease_until_ms);
                let renewed = self.new.renew(biz, key, claim, lease).await;
                return self.ended(renewed, Some(r.fence)).map(|_| false);
            }
            Status::Succeeded => finish(self.new, &r, claim).await,
            Status::Failed => {
                if let Some(steps) = &r.steps {
                    let _ = self.new.save_steps(biz, key, claim, steps).await;
                }
                self.new.fail(biz, key, claim).await
            }
            Status::Processing => {
                // Its lease ended with the holder's work unfinished: a takeover's to recover. The
                // holder is fenced out of the old shard first (taken over there and given back),
                // so that it cannot renew or mark there once the new shard is given back.
                if !fence_out(self.old, &r).await? {
                    return Ok(false);
                }
                if let Some(steps) = &r.steps {
                    let _ = self.new.save_steps(biz, key, claim, steps).await;
                }
                self.new.release(biz, key, claim).await
            }
        };
        self.ended(answer, Some(r.fence))
    }

    /// After a write under the tool's claim on the new shard: `true` when it was taken. When the
    /// new shard refused it (its claim was taken from the tool after a stall), the key's copy
    /// starts over once the old shard's claim under `fence` is no longer live.
    fn ended(
        &mut self,
        answer: Result<(), IdemError>,
        fence: Option<crate::Fence>,
    ) -> Result<bool, IdemError> {
        match answer {
            Ok(()) => Ok(true),
            Err(IdemError::LeaseLost { .. }) => {
                self.claim = None;
                if let Some(fence) = fence {
                    self.fence = fence;
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Takes over `r`'s claim on the old shard (its lease ended) and gives it back at once, so that
/// its holder, if it wakes, is refused there. `false` when the old shard answered otherwise
/// (another caller holds it, or it was marked meanwhile): read it again.
async fn fence_out<S: Store>(old: &S, r: &Record) -> Result<bool, IdemError> {
    let ttl = Duration::from_millis(u64::try_from(r.expire_at_ms - now_ms()).unwrap_or(0));
    if ttl < Duration::from_millis(2) {
        return Ok(true);
    }
    let lease = Duration::from_secs(10).min(ttl / 2);
    let req = ClaimRequest {
        biz: &r.biz,
        key: &r.key,
        fingerprint: r.fingerprint.as_deref(),
        lease,
        ttl,
    };
    match old.claim(&req).await? {
        ClaimOutcome::Acquired { claim, how } => {
            give_back(old, &r.biz, &r.key, &claim, how).await?;
            // Anything but a takeover: the record changed meanwhile.
            Ok(how == Acquired::TakeOver)
        }
        _ => Ok(false),
    }
}

/// Marks the new shard's record, held under `claim`, as `r` (a success) says.
async fn finish<S: Store>(new: &S, r: &Record, claim: &Claim) -> Result<(), IdemError> {
    let ttl = from_now(r.expire_at_ms);
    let snapshot = r.snapshot.as_deref().unwrap_or_default();
    match r.result_until_ms {
        None => new.complete(&r.biz, &r.key, claim, snapshot, ttl).await,
        Some(until) => {
            let keep = from_now(until).min(ttl);
            new.complete_keeping(&r.biz, &r.key, claim, snapshot, ttl, keep)
                .await
        }
    }
}

/// Copies `(biz, key)`'s record from `old` to `new` unless `new` holds it or a later one; a record
/// in progress whose holder has no claim on `new` is claimed there by the tool and returned to
/// be watched.
async fn copy_one<'s, S: Store>(
    old: &'s S,
    new: &'s S,
    biz: &str,
    key: &str,
    p: &mut ReshardProgress,
) -> Result<Option<Watched<'s, S>>, IdemError> {
    let Some(r) = old.load(biz, key).await? else {
        return Ok(None);
    };
    let left = r.expire_at_ms - now_ms();
    if left < 2 {
        return Ok(None);
    }
    let lease = match r.status {
        Status::Processing if r.lease_until_ms > now_ms() => from_now(r.lease_until_ms),
        _ => Duration::from_secs(10),
    };
    let ttl = Duration::from_millis(left as u64);
    let lease = lease.min(ttl / 2).max(Duration::from_millis(1));
    let req = ClaimRequest {
        biz,
        key,
        fingerprint: r.fingerprint.as_deref(),
        lease,
        ttl: ttl.max(lease + Duration::from_millis(1)),
    };
    let watched = |claim| Watched {
        old,
        new,
        biz: biz.to_owned(),
        key: key.to_owned(),
        fence: r.fence,
        claim,
    };
    match new.claim(&req).await? {
        ClaimOutcome::Acquired { claim, how } => {
            // The old record may have changed while the new shard was claimed (a retry or a
            // takeover that ran, a mark): only the state read now may be written; otherwise the
            // claim is given back and the key copied again once the old claim is not live.
            let now = old.load(biz, key).await?;
            if now
                .as_ref()
                .is_none_or(|n| n.fence != r.fence || n.status != r.status)
            {
                give_back(new, biz, key, &claim, how).await?;
                return Ok(Some(Watched {
                    fence: now.map_or(r.fence, |n| n.fence),
                    ..watched(None)
                }));
            }
            p.copied += 1;
            if r.status == Status::Succeeded {
                finish(new, &r, &claim).await?;
                return Ok(None);
            }
            if let Some(steps) = &r.steps {
                new.save_steps(biz, key, &claim, steps).await?;
            }
            if r.status == Status::Failed {
                new.fail(biz, key, &claim).await?;
                return Ok(None);
            }
            Ok(Some(watched(Some(claim))))
        }
        // The new shard holds a claim: the holder's own (it claimed in a dual phase, and marks
        // the new shard first from now on), a mark about to land, or the claim of an earlier
        // run of the tool that stopped. Watched until the old record ends, then copied again.
        ClaimOutcome::InProgress { .. } => Ok(Some(watched(None))),
        ClaimOutcome::Replay { .. } | ClaimOutcome::ResultGone => Ok(None),
        ClaimOutcome::Mismatch => {
            p.conflicts += 1;
            tracing::warn!(
                biz,
                key,
                "a moving key's new shard holds a success from another payload; the old shard's \
                 record is not copied"
            );
            Ok(None)
        }
    }
}
