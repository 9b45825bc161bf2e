//! What can go wrong between the agent and NIXL, by kind, with what NIXL or the loader said.

use std::path::PathBuf;

use super::capi::{self, Status};

/// An error of the NIXL transport below the transfer's own report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NixlError {
    /// `--nixl-lib` names a file that is not there.
    #[error("--nixl-lib {}: no such file", .0.display())]
    NoSuchLibrary(PathBuf),
    /// No C API library anywhere the agent looks.
    #[error(
        "no {lib} found (install NIXL: `pip install nixl-cu12`, or point --nixl-lib / NIXL_PREFIX at it); looked under {}",
        .looked.join(", ")
    )]
    NotFound { lib: &'static str, looked: Vec<String> },
    /// The dynamic loader refused the library.
    #[error("dlopen {}: {reason}", .path.display())]
    Load { path: PathBuf, reason: String },
    /// The library lacks a function this agent calls.
    #[error("{} lacks {symbol} (not the NIXL C API this agent speaks)", .path.display())]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    /// Another NIXL was loaded into this process first; two cannot live side by side.
    #[error("NIXL is already loaded from {} in this process; {} cannot be loaded beside it", .loaded.display(), .wanted.display())]
    OtherLoaded { loaded: PathBuf, wanted: PathBuf },
    /// A path or name with a NUL byte, which C cannot take.
    #[error("{what} contains NUL")]
    Nul { what: &'static str },
    /// A NIXL call answered with an error status.
    #[error("{what}: {} ({status})", capi::status_name(*.status))]
    Call { what: String, status: Status },
    /// NIXL has no UCX plugin to create its backend from.
    #[error("NIXL has no usable UCX plugin ({}; plugins found: {})", capi::status_name(*.status), if .plugins.is_empty() { "none".to_owned() } else { .plugins.join(", ") })]
    NoUcxPlugin { status: Status, plugins: Vec<String> },
}

impl NixlError {
    /// `Ok` when `status` is NIXL's success, else the call's error.
    pub fn check(what: impl Into<String>, status: Status) -> Result<(), NixlError> {
        if status == capi::SUCCESS { Ok(()) } else { Err(NixlError::Call { what: what.into(), status }) }
    }
}
