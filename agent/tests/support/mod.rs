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

/// The site-packages holding the NIXL wheel (RAILGUARD_NIXL_LIB, else scripts/setup.sh's
/// virtualenv under the cache).
pub fn nixl_site_packages() -> PathBuf {
    if let Some(p) = std::env::var_os("RAILGUARD_NIXL_LIB") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let lib = cache.join("railguard/nixl/lib");
    let py = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup.sh (it installs nixl-cu12)", lib.display()))
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .expect("no python3.* in the NIXL virtualenv: run scripts/setup.sh");
    py.path().join("site-packages")
}
