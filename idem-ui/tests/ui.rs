//! Compile-time behaviour of the macros: every error they can give, as the user sees it
//! (`tests/ui/<macro>_<condition>.stderr`, message and span), and the forms that must compile
//! (`tests/ui/pass_*.rs`). Regenerate snapshots with `TRYBUILD=overwrite cargo test -p idem-ui --test ui`, then
//! read every changed `.stderr`: the span must be on the user's token, the message must say the fix,
//! and no name of idem's generated code may show. `IDEM_UI=state_transition_*` runs only the files
//! matching that pattern.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    if let Ok(only) = std::env::var("IDEM_UI") {
        let path = format!("tests/ui/{only}.rs");
        if only.starts_with("pass_") {
            t.pass(path);
        } else {
            t.compile_fail(path);
        }
        return;
    }
    // Files that name a server backend's types compile only with its feature.
    let needs = |name: &str| {
        (name.contains("_mysql_") && !cfg!(feature = "mysql"))
            || (name.contains("_postgres_") && !cfg!(feature = "postgres"))
            || (name.contains("_dynamodb_") && !cfg!(feature = "dynamodb"))
    };
    let mut idempotent: Vec<_> = std::fs::read_dir("tests/ui")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("idempotent_") && name.ends_with(".rs") && !needs(name))
        .collect();
    idempotent.sort();
    for name in idempotent {
        t.compile_fail(format!("tests/ui/{name}"));
    }
    t.compile_fail("tests/ui/consume_token_*.rs");
    t.compile_fail("tests/ui/state_machine_*.rs");
    let mut transitions: Vec<_> = std::fs::read_dir("tests/ui")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("state_transition_") && name.ends_with(".rs"))
        .collect();
    transitions.sort();
    for name in transitions {
        t.compile_fail(format!("tests/ui/{name}"));
    }
    t.pass("tests/ui/pass_*.rs");
}
