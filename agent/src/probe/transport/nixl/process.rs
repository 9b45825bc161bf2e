//! NIXL in this process: its C API is loaded once and stays loaded ([`api`]); its libraries'
//! destructors crash at `exit()`, so a process that loaded it ends with `_exit` ([`exit`]); two
//! transports are not opened at once, since opening sets UCX variables around NIXL's backend
//! creation ([`OPENING`]).
#![allow(unsafe_code)] // _exit

use std::ffi::c_int;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};

use super::NixlConfig;
use super::capi::Api;
use super::error::NixlError;
use super::locate;
use super::ucx_log::ucx_log;

/// The loaded C API: one per process (NIXL and its UCX stay loaded once loaded).
static API: OnceLock<Result<Api, NixlError>> = OnceLock::new();
/// Opening sets UCX variables around NIXL's backend creation: one open at a time.
pub(super) static OPENING: Mutex<()> = Mutex::new(());
/// Numbers the agents of each open, so their names never repeat in the process.
pub(super) static SEQ: AtomicU64 = AtomicU64::new(0);

/// NIXL was loaded into this process. Its libraries' destructors crash at `exit()` (libnl-route,
/// loaded by UCX's IB transport, seen with the 1.5.1 wheel), so a process that loaded it ends
/// with `_exit` after flushing ([`exit`]).
pub fn loaded() -> bool {
    API.get().is_some_and(Result::is_ok)
}

/// Ends the process with `code` without running library destructors (see [`loaded`]).
pub fn exit(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // The private directory of UCX's log goes with the process.
    if let Some(dir) = ucx_log().and_then(|f| f.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    // SAFETY: _exit ends the process at once; buffered Rust output was flushed above.
    unsafe { libc::_exit(c_int::from(code)) }
}

/// The C API of the NIXL `cfg` names (or the one found), loaded on first use.
pub(super) fn api(cfg: &NixlConfig) -> Result<&'static Api, NixlError> {
    let env = |k: &str| std::env::var(k).ok();
    let path = locate::locate(cfg.lib.as_deref(), &env)?;
    let loaded = API.get_or_init(|| {
        // UCX reads these when NIXL's UCX plugin loads it: set them first (see ucx_log).
        ucx_log();
        Api::load(&path)
    });
    match loaded {
        Ok(a) if a.path == path => Ok(a),
        Ok(a) => Err(NixlError::OtherLoaded { loaded: a.path.clone(), wanted: path }),
        Err(e) => Err(e.clone()),
    }
}

/// Runs `f` with the UCX variables set (and restores them): NIXL's UCX backend reads its
/// configuration from the environment when it is created.
pub(super) fn with_ucx_env<T>(vars: &[(&str, Option<&str>)], f: impl FnOnce() -> T) -> T {
    let saved: Vec<(&str, Option<std::ffi::OsString>)> =
        vars.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| (*k, std::env::var_os(k))).collect();
    for (k, v) in vars {
        if let Some(v) = v {
            // SAFETY: under OPENING; these UCX variables are read only by UCX, inside `f`.
            unsafe { std::env::set_var(k, v) };
        }
    }
    let out = f();
    for (k, old) in saved {
        // SAFETY: as above.
        unsafe {
            match old {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
    out
}
