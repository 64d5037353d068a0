//! Token stores registered by name at start-up, for `#[consume_token(store = "name")]`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use super::TokenStore;
use crate::IdemError;

static TOKENS: LazyLock<RwLock<HashMap<String, Arc<dyn TokenStore>>>> =
    LazyLock::new(Default::default);

/// Registers a token store under `name`, replacing any earlier one.
pub fn register_tokens(name: impl Into<String>, tokens: impl TokenStore) {
    TOKENS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.into(), Arc::new(tokens));
}

/// The names token stores are registered under.
pub(crate) fn registered_token_names() -> Vec<String> {
    TOKENS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .cloned()
        .collect()
}

/// The token store registered under `name`.
///
/// # Errors
/// [`IdemError::UnknownStore`] when nothing was registered under that name.
pub fn tokens(name: &str) -> Result<Arc<dyn TokenStore>, IdemError> {
    TOKENS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .cloned()
        .ok_or_else(|| IdemError::UnknownStore {
            name: name.to_owned(),
        })
}
