//! Stores registered by name at start-up, so `store = "name"` can find them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use crate::{IdemError, Store};

static STORES: LazyLock<RwLock<HashMap<String, Arc<dyn Store>>>> = LazyLock::new(Default::default);

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
}

/// Removes the store registered under `name`, returning it.
pub fn unregister_store(name: &str) -> Option<Arc<dyn Store>> {
    STORES
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(name)
}

/// The store registered under `name`.
///
/// # Errors
/// [`IdemError::UnknownStore`] when nothing was registered under that name.
pub fn store(name: &str) -> Result<Arc<dyn Store>, IdemError> {
    let stores = STORES
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    stores
        .get(name)
        .cloned()
        .ok_or_else(|| IdemError::UnknownStore {
            name: name.to_owned(),
        })
}
