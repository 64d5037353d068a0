//! Holds idem's macro snapshots (`tests/ui`); nothing here is for users. A package of its own so
//! that trybuild, which builds every case against the package's dev-dependencies, compiles only
//! what the cases name.
