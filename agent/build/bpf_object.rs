//! Compiles `ebpf/railguard.bpf.c` into a BPF object for one target architecture. Shared by
//! `build.rs` (the architecture being built) and `tests/bpf_object.rs` (every supported one), so
//! the flags live in one place.
//!
//! The architecture matters: `bpf_tracing.h` reads probe arguments (`PT_REGS_PARM2` …) from the
//! register layout of `__TARGET_ARCH_<name>`, described by that architecture's `asm/ptrace.h`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A supported architecture: Rust's `target_arch`, `bpf_tracing.h`'s name, the Debian multiarch
/// triple whose `asm/` headers describe its registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfArch {
    pub rust: &'static str,
    pub bpf: &'static str,
    pub triple: &'static str,
}

/// GPU nodes come as x86_64 and as arm64 (Grace).
pub const SUPPORTED: [BpfArch; 2] = [
    BpfArch { rust: "x86_64", bpf: "x86", triple: "x86_64-linux-gnu" },
    BpfArch { rust: "aarch64", bpf: "arm64", triple: "aarch64-linux-gnu" },
];

/// Why the object could not be built.
#[derive(Debug)]
pub enum BpfBuildError {
    /// No eBPF support for this `target_arch`.
    UnsupportedArch(String),
    /// Neither the native multiarch nor the cross headers of the architecture are installed.
    NoArchHeaders { triple: &'static str, tried: Vec<PathBuf> },
    /// clang could not be run.
    ClangMissing { clang: String, source: std::io::Error },
    /// clang ran and failed.
    ClangFailed { status: std::process::ExitStatus, stderr: String },
}

impl std::fmt::Display for BpfBuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BpfBuildError::UnsupportedArch(a) => {
                write!(f, "no eBPF build for target_arch {a} (supported: x86_64, aarch64)")
            }
            BpfBuildError::NoArchHeaders { triple, tried } => write!(
                f,
                "no asm/ptrace.h for {triple} (looked in {}); install linux-libc-dev (native) or \
                 linux-libc-dev-{}-cross",
                tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
                if triple.starts_with("aarch64") { "arm64" } else { "amd64" }
            ),
            BpfBuildError::ClangMissing { clang, source } => {
                write!(f, "{clang} not found ({source}); apt-get install clang libbpf-dev")
            }
            BpfBuildError::ClangFailed { status, stderr } => write!(f, "clang failed ({status}): {stderr}"),
        }
    }
}

impl std::error::Error for BpfBuildError {}

/// The architecture for Rust's `target_arch`.
pub fn arch(target_arch: &str) -> Result<BpfArch, BpfBuildError> {
    SUPPORTED
        .iter()
        .find(|a| a.rust == target_arch)
        .copied()
        .ok_or_else(|| BpfBuildError::UnsupportedArch(target_arch.to_owned()))
}

/// Where `arch`'s `asm/` headers are: the native multiarch directory, or Debian's cross package.
pub fn arch_include(arch: BpfArch) -> Result<PathBuf, BpfBuildError> {
    let tried = vec![
        PathBuf::from(format!("/usr/include/{}", arch.triple)),
        PathBuf::from(format!("/usr/{}/include", arch.triple)),
    ];
    match tried.iter().find(|d| d.join("asm/ptrace.h").exists()) {
        Some(d) => Ok(d.clone()),
        None => Err(BpfBuildError::NoArchHeaders { triple: arch.triple, tried }),
    }
}

/// Compiles `source` (which includes `railguard_events.h` beside it) into `out` for `arch`.
pub fn compile(clang: &str, source: &Path, arch: BpfArch, out: &Path) -> Result<(), BpfBuildError> {
    let include = arch_include(arch)?;
    let output = Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{}", arch.bpf))
        .arg(format!("-I{}", include.display()))
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|source| BpfBuildError::ClangMissing { clang: clang.to_owned(), source })?;
    if !output.status.success() {
        return Err(BpfBuildError::ClangFailed {
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(())
}
