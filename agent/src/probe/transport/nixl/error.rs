//! What can go wrong between the agent and NIXL, by kind, with what NIXL or the loader said:
//! NIXL's own status codes ([`Status`], by name), and the agent's errors around them.

use std::ffi::c_int;
use std::path::PathBuf;

/// `nixl_capi_status_t`.
pub type Status = c_int;
pub const SUCCESS: Status = 0;
pub const IN_PROG: Status = 1;

/// `nixl_capi_status_t` by name, as NIXL's header spells it; unknown codes by number.
pub fn status_name(s: Status) -> String {
    match s {
        0 => "NIXL_CAPI_SUCCESS".into(),
        1 => "NIXL_CAPI_IN_PROG".into(),
        -1 => "NIXL_CAPI_ERROR_INVALID_PARAM".into(),
        -2 => "NIXL_CAPI_ERROR_BACKEND".into(),
        -3 => "NIXL_CAPI_ERROR_INVALID_STATE".into(),
        -4 => "NIXL_CAPI_ERROR_EXCEPTION".into(),
        -5 => "NIXL_CAPI_ERROR_NO_TELEMETRY".into(),
        -6 => "NIXL_CAPI_ERROR_NOT_FOUND".into(),
        n => format!("NIXL status {n}"),
    }
}

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
    #[error("{what}: {} ({status})", status_name(*.status))]
    Call { what: String, status: Status },
    /// NIXL has no UCX plugin to create its backend from.
    #[error("NIXL has no usable UCX plugin ({}; plugins found: {})", status_name(*.status), if .plugins.is_empty() { "none".to_owned() } else { .plugins.join(", ") })]
    NoUcxPlugin { status: Status, plugins: Vec<String> },
}

impl NixlError {
    /// `Ok` when `status` is NIXL's success, else the call's error.
    pub fn check(what: impl Into<String>, status: Status) -> Result<(), NixlError> {
        if status == SUCCESS { Ok(()) } else { Err(NixlError::Call { what: what.into(), status }) }
    }
}
