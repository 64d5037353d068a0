//! What a server error reads as: its server, code and message, never the server's source line.

use super::mysql::my_url;
use super::*;

/// A table never migrated, on each SQL store: the error names the server, its code and its
/// message, and says how to fix it; never the line of the server's C source that raised it
/// (Postgres's `… at line 1392`), nor its file; through a call, also the step of idem's protocol
/// ("during the claim").
#[tokio::test]
async fn a_server_error_reads_as_the_servers_message_with_its_code() {
    let mut stores: Vec<(&str, idem::AnyStore, &str)> = Vec::new();
    let dir = std::env::temp_dir().join(format!("idem-ec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = format!("sqlite:{}", dir.join("never.db").display());
    stores.push((
        "SQLite",
        idem::connect(&sqlite).await.unwrap(),
        "SQLite error 1: no such table",
    ));
    let pg_url = server::pg_url();
    if let Some(store) = server::reach("Postgres", &pg_url, idem::connect(&pg_url)).await {
        stores.push(("Postgres", store, "Postgres error 42P01: relation"));
    }
    if let Some(store) = server::reach("MySQL", &my_url(), idem::connect(&my_url())).await {
        stores.push(("MySQL", store, "MySQL error 1146 (42S02): Table"));
    }
    for (service, store, says) in stores {
        let store = store.with_table(&server::unique("idem_never")).unwrap();
        let err = store.load("PAY", "k").await.unwrap_err();
        let shown = err.to_string();
        assert!(
            matches!(err, IdemError::StoreSchema { .. }) && shown.contains(says),
            "{service}: {shown}"
        );
        assert!(shown.contains("migrate()"), "{service}: {shown}");
        assert!(!shown.contains(" at line "), "{service}: {shown}");
        let debug = format!("{err:?}");
        assert!(
            !debug.contains(".c\"") && !debug.contains("idem-runtime/"),
            "{service}: {debug}"
        );
        // Through a call, the error also names the step of idem's it came from.
        let err = Call::new("PAY", "k")
            .run(&store, async { Ok::<_, IdemError>(1u8) })
            .await
            .unwrap_err();
        let shown = err.to_string();
        assert!(
            matches!(err, IdemError::StoreSchema { .. })
                && shown.contains(&format!("during the claim, {says}")),
            "{service}: {shown}"
        );
    }
}
