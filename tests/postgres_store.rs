//! Postgres-specific tests (filled in below).
