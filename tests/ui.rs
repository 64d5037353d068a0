//! Compile-time behaviour of `#[idempotent]`: every error the macro can give, as the user sees it
//! (`tests/ui/idempotent_*.stderr`, message and span), and the forms that must compile
//! (`tests/ui/pass_*.rs`). Regenerate snapshots with `TRYBUILD=overwrite cargo test --test ui`, then
//! read every changed `.stderr`: the span must be on the user's token and the message must say the fix.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/idempotent_*.rs");
    t.compile_fail("tests/ui/state_machine_*.rs");
    t.compile_fail("tests/ui/state_transition_*.rs");
    t.pass("tests/ui/pass_*.rs");
}
