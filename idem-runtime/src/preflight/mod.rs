//! Start-up preflight: [`preflight`] checks, before the first request, that every store and token
//! store an attribute in this binary names (`store = "…"`) is registered, and that each store's
//! schema is there, and lists every problem in one error. The names are collected at link time:
//! each attribute with a named store submits one [`StoreUse`] (the `inventory` crate).

use crate::IdemError;

/// A store name an attribute uses, submitted by the generated code.
#[doc(hidden)]
pub struct StoreUse {
    /// The registered name (`store = "orders"`).
    pub name: &'static str,
    /// A token store (`#[consume_token]`) rather than a record store.
    pub tokens: bool,
    /// The attribute, for people: `#[idempotent] pay`.
    pub by: &'static str,
    /// Where: `src/pay.rs:42`.
    pub at: &'static str,
}

inventory::collect!(StoreUse);

/// The business type and key preflight reads (one read, no write) to find a store's schema.
const PROBE: (&str, &str) = ("IDEM_PREFLIGHT", "schema-check");

/// Checks every store and token-store name used by an `#[idempotent]`, `#[state_transition]` or
/// `#[consume_token]` in this binary: that it is registered ([`crate::register_store`],
/// [`crate::register_tokens`]), and for each record store that it answers and its table is there
/// (one read of a record; nothing is written). Call it at start-up, after registering the
/// stores, so a mistake fails the start instead of the first request.
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// # use idem_runtime as idem;
/// let store = idem::SqliteStore::in_memory().await?;
/// store.migrate().await?;
/// idem::register_store("orders", store);
/// idem::preflight().await?; // every name the attributes use is there, and migrated
/// # Ok(()) }
/// ```
///
/// Token stores are checked for registration only.
///
/// # Errors
/// [`IdemError::Preflight`] listing every problem: a name nobody registered (with the attribute
/// and the file and line that use it), a store whose table is missing ("run migrate()"), a store
/// that cannot be reached.
pub async fn preflight() -> Result<(), IdemError> {
    let mut uses: Vec<&StoreUse> = inventory::iter::<StoreUse>.into_iter().collect();
    uses.sort_by_key(|u| (u.tokens, u.name, u.at));
    let mut problems = Vec::new();
    let mut checked: Vec<(bool, &str)> = Vec::new();
    for used in uses {
        let seen = checked.contains(&(used.tokens, used.name));
        if used.tokens {
            if crate::tokens(used.name).is_err() && !seen {
                problems.push(format!(
                    "token store `{}` (used by {} at {}) is not registered{}: call \
                     `idem::register_tokens(\"{}\", …)` before serving",
                    used.name,
                    used.by,
                    used.at,
                    crate::registry::unknown_store_hint(used.name),
                    used.name
                ));
            }
        } else if !seen {
            match crate::store(used.name) {
                Err(_) => problems.push(format!(
                    "store `{}` (used by {} at {}) is not registered{}: call \
                     `idem::register_store(\"{}\", …)` before serving",
                    used.name,
                    used.by,
                    used.at,
                    crate::registry::unknown_store_hint(used.name),
                    used.name
                )),
                Ok(store) => match store.load(PROBE.0, PROBE.1).await {
                    Ok(_) => {}
                    Err(IdemError::StoreSchema { .. }) => problems.push(format!(
                        "store `{}` ({}) has no table for idem's records: run migrate() on it \
                         (or apply the store's MIGRATIONS)",
                        used.name,
                        store.backend()
                    )),
                    Err(e) => problems.push(format!(
                        "store `{}` ({}) did not answer: {e}",
                        used.name,
                        store.backend()
                    )),
                },
            }
        }
        if !seen {
            checked.push((used.tokens, used.name));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(IdemError::Preflight { problems })
    }
}
