//! `idem::preflight()`: the store names this binary's attributes use, collected at link time,
//! checked at start-up. An unregistered record store, an unregistered token store and a store
//! without its table are each one line of one error; once registered and migrated it passes.

use idem::{IdemError, SqliteStore, consume_token, idempotent, state_transition};

#[idempotent(biz = "PF", key = "id", store = "preflight_missing")]
async fn uses_a_missing_store(id: u64) -> Result<u64, IdemError> {
    Ok(id)
}

#[idempotent(biz = "PF", key = "id", store = "preflight_unmigrated")]
async fn uses_an_unmigrated_store(id: u64) -> Result<u64, IdemError> {
    Ok(id)
}

/// The same name twice: one problem, not two.
#[idempotent(biz = "PF2", key = "id", store = "preflight_unmigrated")]
async fn uses_it_again(id: u64) -> Result<u64, IdemError> {
    Ok(id)
}

#[consume_token(token = "token", store = "preflight_tokens")]
async fn spends_a_token(token: &str) -> Result<(), IdemError> {
    let _ = token;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, idem::StateMachine)]
#[state_machine(table = "pf_orders", key = "order_no", status = "status")]
pub enum Pf {
    #[state(to(Done))]
    Open,
    #[state(terminal)]
    Done,
}

#[state_transition(from = "OPEN", to = "DONE", store = "preflight_transitions")]
async fn finish(order_no: &str) -> Result<idem::Transition<(), Pf>, IdemError> {
    Ok(())
}

#[tokio::test]
async fn preflight_lists_every_problem_then_passes() {
    let unmigrated = SqliteStore::in_memory().await.unwrap();
    idem::register_store("preflight_unmigrated", unmigrated.clone());
    let err = idem::preflight().await.unwrap_err();
    let IdemError::Preflight { problems } = &err else {
        panic!("{err:?}")
    };
    let text = err.to_string();
    assert_eq!(problems.len(), 4, "{text}");
    for (name, says) in [
        ("preflight_missing", "is not registered"),
        ("preflight_transitions", "is not registered"),
        ("preflight_tokens", "register_tokens"),
        ("preflight_unmigrated", "run migrate()"),
    ] {
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&format!("`{name}`")) && p.contains(says)),
            "{name}: {text}"
        );
    }
    assert!(
        text.contains("#[idempotent] uses_a_missing_store"),
        "{text}"
    );
    // It names what is registered; no name is close enough to be a misspelling of it.
    assert!(
        text.contains("`preflight_missing` (used by") && text.contains("(registered: "),
        "{text}"
    );
    assert!(!text.contains("did you mean"), "{text}");
    assert!(text.contains("tests/preflight.rs:"), "{text}");

    unmigrated.migrate().await.unwrap();
    let other = SqliteStore::in_memory().await.unwrap();
    other.migrate().await.unwrap();
    idem::register_store("preflight_missing", other.clone());
    idem::register_store("preflight_transitions", other.clone());
    idem::register_tokens("preflight_tokens", other.tokens());
    idem::preflight().await.unwrap();
    // The functions are there to be counted, and they work once registered.
    assert_eq!(uses_a_missing_store(1).await.unwrap(), 1);
    assert_eq!(uses_an_unmigrated_store(2).await.unwrap(), 2);
    assert_eq!(uses_it_again(3).await.unwrap(), 3);
    let _ = (spends_a_token, finish);
}
