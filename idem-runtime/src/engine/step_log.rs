//! The log of one lease-mode call's saved steps, shared by the body's steps (steps.rs) and the
//! holder that reads and saves it (holder.rs); kept apart from both so the running body's scope
//! (current.rs) can hold it without knowing how steps run.

use std::sync::Mutex;

use serde_json::{Map, Value};
use tokio::sync::{Notify, oneshot};

use crate::IdemError;

/// The log of one call's saved steps: name → what the step returned.
pub(crate) type Log = Map<String, Value>;

/// The steps of one lease-mode call, shared by the body's steps and the holder.
pub(crate) struct Steps {
    state: Mutex<State>,
    /// Wakes the holder when a step asks for something.
    pub(crate) wake: Notify,
}

pub(super) struct State {
    /// The saved log; `None` while it is empty and nothing was read back (a fresh record starts
    /// with none, and makes it at its first step: a call without steps never makes one).
    pub(super) log: Option<Log>,
    /// Whether the log still has to be read back (a takeover or a retry: the record may hold the
    /// steps of an earlier attempt).
    unread: bool,
    /// What steps asked for, in order.
    asks: Vec<Ask>,
}

/// One step's request to the holder: before its work, that the claim is still held (and the log
/// read, after a takeover or a retry; `save: None`), or after it, to save the log that now holds
/// the step `save`.
pub(crate) struct Ask {
    pub(crate) save: Option<String>,
    pub(crate) reply: oneshot::Sender<Result<(), IdemError>>,
}

impl Steps {
    /// The steps of a call whose claim `fresh`ly created its record (nothing saved yet), or took
    /// over or retried one (its log is read when the first step asks).
    pub(crate) fn new(fresh: bool) -> Self {
        Steps {
            state: Mutex::new(State {
                log: None,
                unread: !fresh,
                asks: Vec::new(),
            }),
            wake: Notify::new(),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change under the lock is a single insert, push or assignment.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends an ask to the holder and waits for its answer.
    pub(super) async fn ask(&self, save: Option<String>) -> Result<(), IdemError> {
        let (reply, answer) = oneshot::channel();
        self.lock().asks.push(Ask { save, reply });
        self.wake.notify_one();
        answer.await.unwrap_or_else(|_| {
            Err(IdemError::store(
                "the call's holder ended before it answered a step",
            ))
        })
    }

    /// The asks since the last call, and whether the log still has to be read.
    pub(crate) fn take_asks(&self) -> (Vec<Ask>, bool) {
        let mut state = self.lock();
        (std::mem::take(&mut state.asks), state.unread)
    }

    /// Sets the log read back from the record.
    pub(crate) fn set_log(&self, log: Log) {
        let mut state = self.lock();
        if state.unread {
            state.log = Some(log);
            state.unread = false;
        }
    }

    /// The log as it is saved.
    pub(crate) fn encoded(&self) -> Vec<u8> {
        let state = self.lock();
        serde_json::to_vec(state.log.as_ref().unwrap_or(&Log::new())).unwrap_or_default()
    }

    /// Forgets the steps `names` (their save was refused for good: saving them again would fail
    /// again, and every later step with them).
    pub(crate) fn forget(&self, names: &[&str]) {
        let mut state = self.lock();
        if let Some(log) = state.log.as_mut() {
            for name in names {
                log.remove(*name);
            }
        }
    }
}

/// The log saved in a record, as [`Steps::encoded`] wrote it (no steps: an empty log).
pub(crate) fn decode_log(saved: Option<&[u8]>) -> Result<Log, IdemError> {
    match saved {
        None => Ok(Log::new()),
        Some(bytes) => serde_json::from_slice(bytes).map_err(|e| IdemError::Step {
            step: String::new(),
            reason: format!(
                "the record's saved steps cannot be read ({e}); no step runs again until the \
                 record is resolved"
            ),
        }),
    }
}
