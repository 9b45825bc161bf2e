//! Shared by the integration tests that need it.
#![allow(clippy::unwrap_used, dead_code)] // test code; not every test crate uses every helper

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the libcuda test double (tests/cuda_fake/libcuda.c) into `dir` as `libcuda.so`, the
/// name cudarc loads; put `dir` on LD_LIBRARY_PATH to use it.
pub fn build_fake_cuda(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_fake/libcuda.c");
    let out = dir.join("libcuda.so");
    let st = Command::new("cc").args(["-shared", "-fPIC", "-O1", "-Wall", "-o"]).arg(&out).arg(&src).status().unwrap();
    assert!(st.success(), "building the libcuda test double failed");
    out
}
