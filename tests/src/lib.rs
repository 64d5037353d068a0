//! idem's integration suite. Nothing here is for users: the package holds the tests that drive
//! every store through the contract on real servers, the HTTP layer, the broker consumers, the
//! crash and fault scenarios, and the examples and benches that need more than idem itself
//! (axum, reqwest, lapin, async-nats, a Prometheus exporter, proptest). Keeping them out of the
//! `idem` package keeps its dev-dependencies, and so the quickstart's build, small.

pub mod doc_table;
