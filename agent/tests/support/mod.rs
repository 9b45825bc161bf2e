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

/// NIXL's C API as the agent itself finds it: RAILGUARD_NIXL_LIB (as `--nixl-lib` takes it), else
/// its own search, which includes the virtualenv scripts/setup.sh installs the wheel into.
pub fn nixl_capi() -> PathBuf {
    let explicit = std::env::var_os("RAILGUARD_NIXL_LIB").map(PathBuf::from);
    railguard_agent::probe::transport::nixl::locate::locate(explicit.as_deref(), &|k| std::env::var(k).ok())
        .unwrap_or_else(|e| panic!("{e} (scripts/setup.sh installs nixl-cu12)"))
}

/// A library the NIXL wheel bundles in `nixl_cu12.libs/`, by the start of its (renamed) file
/// name: `libucp-`, `libibverbs-`.
pub fn nixl_wheel_lib(prefix: &str) -> PathBuf {
    let capi = nixl_capi();
    let libs = capi.parent().and_then(Path::parent).unwrap().join("nixl_cu12.libs");
    std::fs::read_dir(&libs)
        .unwrap_or_else(|e| panic!("{}: {e}: not the nixl-cu12 wheel", libs.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("the wheel ships no {prefix}*"))
}

/// The Python of the virtualenv scripts/setup.sh installs NIXL and numpy into (or
/// RAILGUARD_NIXL_PYTHON), for railguard's NIXL library (integrations/nixl).
pub fn nixl_python() -> PathBuf {
    railguard_agent::probe::transport::nixl::locate::setup_python(&|k| std::env::var(k).ok())
        .expect("no NIXL virtualenv: scripts/setup.sh installs nixl-cu12 and numpy into ~/.cache/railguard/nixl")
}
