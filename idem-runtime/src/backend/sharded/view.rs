//! A process's view of its sharded store's layout, and where it routes a key.
//!
//! The view is read again every [`REFRESH_EVERY`]; a view older than [`STALE_AFTER`] routes
//! nothing (the call waits for a new reading, and fails as unavailable if no shard answers). So
//! a step written to every shard is seen by every process within [`STALE_AFTER`] of its writing,
//! and the reshard tool, waiting at least that long between two steps, knows that no process is
//! more than one step behind the newest.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ShardedStore;
use super::layout::{self, Layout, Phase};
use super::route;
use crate::IdemError;
use crate::store::Store;

/// How often a process reads its layout again.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// How old a process's reading of its layout may be before it routes nothing.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// What a process last read of its layout.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// The newest step; `None`: no layout was written, keys route over the shards in the order
    /// the process was given them.
    pub(crate) layout: Option<Layout>,
    /// The layout's `from` shards as indexes of the process's own (`None`: not given to it).
    from: Vec<Option<usize>>,
    /// The layout's `to` shards, likewise.
    to: Vec<Option<usize>>,
    /// When the reading that made this view started; `None` before the first.
    read_at: Option<Instant>,
}

/// Where a key's claims and marks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// One shard.
    One(usize),
    /// The key moves from shard `a` to shard `b` and the reshard is in a dual phase.
    Move { a: usize, b: usize, phase: Phase },
}

impl View {
    /// The shard `(biz, key)` lives on when no reshard moves it: its `to` home once the dual
    /// phases began, its `from` home before.
    pub(crate) fn home(&self, biz: &str, key: &str, shards: usize) -> Option<usize> {
        match &self.layout {
            None => Some(route::shard(biz, key, shards)),
            Some(l) if l.phase >= Phase::DualNew => self.to[route::shard(biz, key, l.to.len())],
            Some(l) => self.from[route::shard(biz, key, l.from.len())],
        }
    }

    /// The shard a claim of `(biz, key)` that is held on one shard only was made on: the key's
    /// shard, or, while a reshard moves it (and this process may not reach its new shard), its
    /// old one.
    pub(crate) fn claimed_on(
        &self,
        biz: &str,
        key: &str,
        shards: usize,
    ) -> Result<usize, IdemError> {
        match self.route(biz, key, shards) {
            Ok(Route::One(s)) => Ok(s),
            Ok(Route::Move { a, .. }) => Ok(a),
            Err(e) => match &self.layout {
                Some(l) if l.phase < Phase::Done => {
                    self.from[route::shard(biz, key, l.from.len())].ok_or(e)
                }
                _ => Err(e),
            },
        }
    }

    /// Where `(biz, key)`'s claims and marks go.
    pub(crate) fn route(&self, biz: &str, key: &str, shards: usize) -> Result<Route, IdemError> {
        let Some(l) = &self.layout else {
            return Ok(Route::One(route::shard(biz, key, shards)));
        };
        let fi = route::shard(biz, key, l.from.len());
        let ti = route::shard(biz, key, l.to.len());
        let given = |at: Option<usize>, id: &str| {
            at.ok_or_else(|| {
                IdemError::unavailable(format!(
                    "step {} of the sharded store's layout routes ({biz}, {key}) to the shard \
                     with identity {id}, which this process was not given: give it every shard \
                     of the layout (`idem --url <url> reshard --status` lists them)",
                    l.step
                ))
            })
        };
        if l.from[fi] == l.to[ti] {
            return given(self.to[ti], &l.to[ti]).map(Route::One);
        }
        match l.phase {
            Phase::Planned => given(self.from[fi], &l.from[fi]).map(Route::One),
            Phase::Done => given(self.to[ti], &l.to[ti]).map(Route::One),
            phase => Ok(Route::Move {
                a: given(self.from[fi], &l.from[fi])?,
                b: given(self.to[ti], &l.to[ti])?,
                phase,
            }),
        }
    }
}

#[cfg(test)]
impl View {
    /// A view of `layout` by a process whose shards hold the layout's `from` and `to` shards at
    /// these indexes (the model check routes by it).
    pub(crate) fn of(
        layout: Option<Layout>,
        from: Vec<Option<usize>>,
        to: Vec<Option<usize>>,
    ) -> View {
        View {
            layout,
            from,
            to,
            read_at: None,
        }
    }
}

impl<S: Store> ShardedStore<S> {
    /// The view as last read, without reading.
    pub(crate) fn view_now(&self) -> Arc<View> {
        self.inner
            .view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The view to route a call by. One older than [`REFRESH_EVERY`] is read again by a task of
    /// its own, while calls go on with it; one older than [`STALE_AFTER`] (or none yet) is waited
    /// for, and a reading that fails then fails the call.
    pub(crate) async fn view(&self) -> Result<Arc<View>, IdemError> {
        let view = self.view_now();
        let age = view.read_at.map(|at| at.elapsed());
        match age {
            Some(age) if age < REFRESH_EVERY => return Ok(view),
            Some(age) if age < STALE_AFTER => {
                if let Ok(guard) = self.inner.refreshing.clone().try_lock_owned() {
                    let store = self.clone();
                    tokio::spawn(async move {
                        let view = store.view_now();
                        if let Err(e) = store.read_view(&view).await {
                            tracing::debug!(error = %e, "a sharded store could not read its layout");
                        }
                        drop(guard);
                    });
                }
                return Ok(view);
            }
            _ => {}
        }
        let guard = self.inner.refreshing.lock().await;
        // Another call or the task may have read it while this one waited.
        let view = self.view_now();
        if view.read_at.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
            return Ok(view);
        }
        let read = self.read_view(&view).await;
        drop(guard);
        read
    }

    /// Reads the steps after `view`'s on every shard (those that answer) and keeps the newest.
    async fn read_view(&self, view: &View) -> Result<Arc<View>, IdemError> {
        let started = Instant::now();
        let shards = &self.inner.shards;
        let all: Vec<&S> = shards.iter().collect();
        let newest = layout::newest(&all, view.layout.clone(), false).await?;
        let (from, to) = match &newest {
            Some(l) => {
                let ids = self.ids_for(l).await?;
                let at = |id: &String| ids.iter().position(|i| i.as_ref() == Some(id));
                (
                    l.from.iter().map(at).collect(),
                    l.to.iter().map(at).collect(),
                )
            }
            None => (Vec::new(), Vec::new()),
        };
        let fresh = Arc::new(View {
            layout: newest,
            from,
            to,
            read_at: Some(started),
        });
        *self.inner.view.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// The shards' identities, read again for those that had none while `l` names one no shard
    /// was known by.
    async fn ids_for(&self, l: &Layout) -> Result<Vec<Option<String>>, IdemError> {
        let known = self
            .inner
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let missing = l
            .from
            .iter()
            .chain(&l.to)
            .any(|id| !known.iter().any(|k| k.as_ref() == Some(id)));
        if !missing || known.iter().all(Option::is_some) {
            return Ok(known);
        }
        let mut ids = known;
        for (i, shard) in self.inner.shards.iter().enumerate() {
            if ids[i].is_none() {
                // A shard that does not answer keeps no identity for now: its keys are refused.
                ids[i] = layout::read_id(shard).await.ok().flatten();
            }
        }
        self.inner
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone_from(&ids);
        Ok(ids)
    }
}
