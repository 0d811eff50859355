//! Tests that account for the whole process, in a test binary of their own:
//! `memory` installs a global allocator that records every allocation, and
//! `fd_leak` counts the process's file descriptors, `cache_memory` its
//! resident memory under the block cache. Tests running beside
//! them would change what they count, so every test here takes
//! `common::serial()` and runs alone.

// This binary uses only part of the shared harness.
#[allow(dead_code)]
#[macro_use]
#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "cache")]
mod cache_memory;
mod fd_leak;
mod memory;
