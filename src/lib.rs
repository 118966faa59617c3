//! Test-and-benchmark host package; see README.md.
