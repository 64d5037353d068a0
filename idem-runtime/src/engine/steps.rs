//! Recovery points: [`step`] saves what one step of a lease-mode body returned under the record its
//! call holds (fenced, like a mark), so an attempt that takes the record over, or retries it after a
//! failure, gets the saved result back instead of running the step again; [`step_key`] names a
//! step for an external API's own idempotency key.
//!
//! The log of a call's steps is a JSON object (name → result) kept in the record's result column
//! until a success replaces it. The body's task reaches it through the task-local of current.rs;
//! the holder (holder.rs), which owns the store and the claim, loads and saves it when a step asks.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Map;

use super::current;
use super::step_log::Log;
use crate::IdemError;

/// The most steps one call saves (distinct names): a step past it is refused before its work
/// runs.
pub const MAX_STEPS: usize = 64;

/// The longest step name, in bytes (names are 1 to 64 bytes, any UTF-8 without control
/// characters).
pub const MAX_STEP_NAME_LEN: usize = 64;

fn refuse(name: &str, reason: impl Into<String>) -> IdemError {
    IdemError::Step {
        step: name.to_owned(),
        reason: reason.into(),
    }
}

fn check_name(name: &str) -> Result<(), IdemError> {
    if name.is_empty() || name.len() > MAX_STEP_NAME_LEN {
        return Err(refuse(
            name,
            format!(
                "a step name is 1 to {MAX_STEP_NAME_LEN} bytes, this one is {}; the step did not run",
                name.len()
            ),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(refuse(
            name,
            "a step name has no control characters; the step did not run",
        ));
    }
    Ok(())
}

/// Runs `work` as the recovery point `name` of the idempotent body running on this task, or
/// returns what it returned in an earlier attempt at this call.
///
/// A lease-mode body whose holder dies (or whose mark never lands) is taken over by the next
/// call, which runs the body again. With its effects in steps, the second run returns the saved
/// results of the steps that completed and runs only the rest (a partial success: the
/// money was taken, so the debit is not sent again):
///
/// ```
/// # use idem_runtime as idem;
/// # #[derive(Debug, thiserror::Error)] #[error(transparent)] struct AppError(#[from] idem_runtime::IdemError);
/// # async fn charge(_: &str, _: &str) -> Result<String, AppError> { Ok("ch_1".into()) }
/// # async fn ship(_: &str) -> Result<u64, AppError> { Ok(7) }
/// # async fn demo(store: &idem_runtime::MemoryStore) -> Result<(), AppError> {
/// use idem::{Call, step, steps::step_key};
///
/// let shipment: u64 = Call::new("ORDER", "order-7")
///     .run(store, async {
///         // The gateway's own Idempotency-Key: the same in every attempt at this call.
///         let key = step_key("charge").expect("inside an idempotent body");
///         let _charge: String = step("charge", charge("order-7", &key)).await?;
///         step("ship", ship("order-7")).await
///     })
///     .await?;
/// # let _ = shipment; Ok(()) }
/// ```
///
/// - When `work` returns `Ok`, its value is saved under the record (JSON, like a result
///   snapshot) before `step` returns it, only while the call still holds its claim (fenced). A
///   later attempt at the same call (a takeover after the lease ended, or a retry after the body
///   failed, with the same payload) gets the saved value and `work` does not run. A success
///   replaces the saved steps with the result; a record that expired starts with none.
/// - When `work` returns `Err`, nothing is saved: the next attempt runs it again.
/// - Before `work` runs, the claim is checked (locally, or with one fenced renewal once its
///   lease's safe part has passed): a holder whose claim was taken over runs no more steps.
/// - A step whose holder died (or paused past its lease) between its effect and its save runs
///   again in the next attempt: pass [`step_key`] to the external API as its idempotency key, so
///   that repeat is deduplicated there.
/// - Names identify steps within one call: 1 to [`MAX_STEP_NAME_LEN`] bytes, no control
///   characters, at most [`MAX_STEPS`] per call. A second `step` with a name that was saved returns
///   the saved value. The whole log must fit the store's snapshot limit.
/// - Outside an idempotent body, in a task the body spawned (task-locals are not inherited), and
///   in transaction mode (`tx = "…"`: the save would be rolled back with the transaction a crash
///   ends), `work` just runs and nothing is saved.
///
/// # Errors
/// `work`'s own error; otherwise an [`IdemError`] converted into `E`: [`IdemError::Step`] for a
/// bad name, a step past [`MAX_STEPS`] (before `work` runs), a value that cannot be encoded or
/// makes the log larger than the store's snapshot limit (after `work` ran: the reason says so),
/// or a saved value that no longer decodes as `T` (`work` does not run), or a result that could
/// not be saved while the lease was live (`work` ran: the reason says so);
/// [`IdemError::LeaseLost`] when the call no longer holds its claim (another attempt took it
/// over: stop); a store error when the log could not be read before `work`.
pub async fn step<T, E, F>(name: &str, work: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<IdemError>,
{
    let Some(current) = current::current() else {
        return work.await;
    };
    let Some(steps) = current.call.steps.as_ref() else {
        return work.await;
    };
    check_name(name)?;
    // The log (read once after a takeover or a retry), and a claim still held: a holder that
    // paused past its lease, or whose heartbeat found it taken over, runs no more steps.
    steps.ask(None).await?;
    let saved = {
        let state = steps.lock();
        let log = state.log.as_ref();
        match log.and_then(|log| log.get(name)) {
            Some(value) => Some(value.clone()),
            None if log.map_or(0, Map::len) >= MAX_STEPS => {
                return Err(refuse(
                    name,
                    format!("a call saves at most {MAX_STEPS} steps; the step did not run"),
                )
                .into());
            }
            None => None,
        }
    };
    if let Some(value) = saved {
        return serde_json::from_value(value).map_err(|e| {
            refuse(
                name,
                format!(
                    "the result saved by an earlier attempt does not decode as the step's type \
                     ({e}); the step did not run again"
                ),
            )
            .into()
        });
    }
    let value = work.await?;
    let json = serde_json::to_value(&value).map_err(|e| {
        refuse(
            name,
            format!("the step ran, but its result cannot be encoded to be saved: {e}"),
        )
    })?;
    steps
        .lock()
        .log
        .get_or_insert_with(Log::new)
        .insert(name.to_owned(), json);
    match steps.ask(Some(name.to_owned())).await {
        Ok(()) => Ok(value),
        Err(e @ (IdemError::LeaseLost { .. } | IdemError::Step { .. })) => Err(e.into()),
        Err(e) => Err(refuse(
            name,
            format!(
                "the step ran, but its result could not be saved while the claim's lease was live \
                 ({e}); the next attempt runs it again (pass `step_key` downstream to deduplicate it)"
            ),
        )
        .into()),
    }
}

/// A key for the step `name` of the idempotent call running on this task, to pass to an external
/// API as its own idempotency key (Stripe's `Idempotency-Key`, a broker's message id): the same in
/// every attempt at the call, in every process, so a step that runs again after its holder died
/// is deduplicated downstream. `None` outside an idempotent body (and in a task it spawned).
///
/// It is 32 lowercase hex digits: the first 128 bits of SHA-256 over the call's business type,
/// its key and `name` (each with its length in front, so no two triples share a key). The same
/// `(biz, key, name)` gives the same key also after the record expired, as the business action is
/// the same; use another name for another action. Works in transaction mode too.
pub fn step_key(name: &str) -> Option<String> {
    let current = current::current()?;
    Some(derive_key(&current.call.biz, &current.call.key, name))
}

fn derive_key(biz: &str, key: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};

    let mut hash = Sha256::new();
    for part in [biz, key, name] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    crate::fingerprint::hex(&hash.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::step_log::decode_log;

    #[test]
    fn keys_are_stable_and_apart() {
        let k = derive_key("PAY", "order-1", "charge");
        assert_eq!(k.len(), 32);
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(k, derive_key("PAY", "order-1", "charge"));
        assert_ne!(k, derive_key("PAY", "order-1", "ship"));
        assert_ne!(k, derive_key("PAY", "order-2", "charge"));
        // Length prefixes: moving a byte from one part to the next gives another key.
        assert_ne!(derive_key("PA", "Yorder-1", "charge"), k);
        // A known value (computed outside Rust), so a change to the derivation, which would break
        // every downstream deduplication across an upgrade, fails here.
        assert_eq!(k, "db79adbf8349715a1c4a835190009735");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("charge").is_ok());
        assert!(check_name(&"n".repeat(MAX_STEP_NAME_LEN)).is_ok());
        for bad in [
            String::new(),
            "n".repeat(MAX_STEP_NAME_LEN + 1),
            "a\nb".into(),
        ] {
            assert!(
                matches!(check_name(&bad), Err(IdemError::Step { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_log_that_cannot_be_read_is_refused() {
        assert!(decode_log(None).unwrap().is_empty());
        let log = decode_log(Some(br#"{"charge":"ch_1"}"#)).unwrap();
        assert_eq!(log["charge"], "ch_1");
        assert!(matches!(
            decode_log(Some(b"not json")),
            Err(IdemError::Step { .. })
        ));
    }
}
