//! Stores registered by name at start-up, so `store = "name"` can find them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock, Weak};

use crate::{IdemError, Store};

static STORES: LazyLock<RwLock<HashMap<String, Arc<dyn Store>>>> = LazyLock::new(Default::default);
/// (generation read at, name, store). Weak: a thread's cache never owns a store, so a store that
/// was replaced or unregistered is dropped where that happened, not later in a thread-local
/// destructor at thread exit (where a pool's drop cannot reach its runtime and would abort the
/// process).
type Resolved = (u64, Box<str>, Weak<dyn Store>);

/// Bumped by every change of the registry, so per-thread caches know when to look again.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The stores this thread looked up lately, with the generation they were read at: a call by
    /// name usually costs one string compare instead of a lock and a hash.
    static CACHE: RefCell<Vec<Resolved>> = const { RefCell::new(Vec::new()) };
}

const CACHE_SLOTS: usize = 8;

/// A store, or a shared pointer to one, that can be registered by name.
pub trait IntoSharedStore {
    /// The store behind an `Arc`.
    fn into_shared(self) -> Arc<dyn Store>;
}

impl<S: Store> IntoSharedStore for S {
    fn into_shared(self) -> Arc<dyn Store> {
        Arc::new(self)
    }
}

impl<S: Store> IntoSharedStore for Arc<S> {
    fn into_shared(self) -> Arc<dyn Store> {
        self
    }
}

impl IntoSharedStore for Arc<dyn Store> {
    fn into_shared(self) -> Arc<dyn Store> {
        self
    }
}

/// Registers `store` (a store, an `Arc` of one, or an `Arc<dyn Store>`) under `name`, replacing
/// any earlier one, for `#[idempotent(store = "name")]`.
pub fn register_store(name: impl Into<String>, store: impl IntoSharedStore) {
    let mut stores = STORES
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    stores.insert(name.into(), store.into_shared());
    GENERATION.fetch_add(1, Ordering::Release);
}

/// Removes the store registered under `name`, returning it.
pub fn unregister_store(name: &str) -> Option<Arc<dyn Store>> {
    let mut stores = STORES
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let removed = stores.remove(name);
    GENERATION.fetch_add(1, Ordering::Release);
    removed
}

/// What to tell a caller who asked for `name`, which nobody registered: `did you mean` the
/// closest registered name, if one is close enough to be a misspelling, and which names are
/// registered (record stores and token stores both: one name space for the error's reader).
pub(crate) fn unknown_store_hint(name: &str) -> String {
    let mut names: Vec<String> = STORES
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .keys()
        .cloned()
        .collect();
    names.extend(crate::tokens::registered_token_names());
    names.sort();
    names.dedup();
    if names.is_empty() {
        return "; none is registered yet".to_owned();
    }
    let listed = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    // A misspelling: a letter or two off, never a third of the name (`pgg` for `pg`, not
    // `orders_eu` for `orders_us`'s neighbour of another meaning).
    let closest = names
        .iter()
        .map(|candidate| (strsim::damerau_levenshtein(name, candidate), candidate))
        .filter(|(distance, candidate)| {
            *distance <= 2 && *distance * 3 <= name.len().max(candidate.len())
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate);
    match closest {
        Some(best) => format!("; did you mean `{best}`? (registered: {listed})"),
        None => format!(" (registered: {listed})"),
    }
}

/// The store registered under `name`.
///
/// # Errors
/// [`IdemError::UnknownStore`] when nothing was registered under that name.
pub fn store(name: &str) -> Result<Arc<dyn Store>, IdemError> {
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = CACHE.with_borrow(|cache| {
        cache
            .iter()
            .find(|(g, n, _)| *g == generation && **n == *name)
            .and_then(|(_, _, s)| s.upgrade())
    });
    if let Some(store) = cached {
        return Ok(store);
    }
    let found = STORES
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(name)
        .cloned();
    let store = found.ok_or_else(|| IdemError::UnknownStore {
        name: name.to_owned(),
    })?;
    CACHE.with_borrow_mut(|cache| {
        cache.retain(|(g, n, _)| *g == generation && **n != *name);
        if cache.len() == CACHE_SLOTS {
            cache.remove(0);
        }
        cache.push((generation, name.into(), Arc::downgrade(&store)));
    });
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn a_replaced_store_is_seen_at_once() {
        register_store("reg_test", MemoryStore::new());
        let first = store("reg_test").unwrap();
        assert!(Arc::ptr_eq(&first, &store("reg_test").unwrap()), "cached");
        register_store("reg_test", MemoryStore::new());
        assert!(
            !Arc::ptr_eq(&first, &store("reg_test").unwrap()),
            "the cache must not hide a new store"
        );
        let second = store("reg_test").unwrap();
        let weak = Arc::downgrade(&second);
        drop(second);
        unregister_store("reg_test");
        assert!(
            weak.upgrade().is_none(),
            "an unregistered store is dropped at once, not held by a thread's cache"
        );
        assert!(matches!(
            store("reg_test"),
            Err(IdemError::UnknownStore { .. })
        ));
    }
}
