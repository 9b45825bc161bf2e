//! NIXL's C API (`libnixl_capi.so`, the functions the `nixl-sys` crate's `wrapper.h` declares),
//! loaded at run time from the NIXL the node has. Only what the probe needs is bound; a library
//! that lacks one of these symbols is refused with the name of the missing one.
#![allow(unsafe_code)] // dlopen/dlsym and calls through the loaded function pointers

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use super::error::NixlError;

pub use super::error::{IN_PROG, SUCCESS, Status, status_name};
pub type Handle = *mut c_void;

/// `nixl_capi_mem_type_t`.
pub const MEM_DRAM: c_int = 0;
pub const MEM_VRAM: c_int = 1;
/// `nixl_capi_xfer_op_t`.
pub const OP_READ: c_int = 0;
pub const OP_WRITE: c_int = 1;

macro_rules! capi {
    ($($name:ident: fn($($arg:ty),*);)*) => {
        /// The bound functions of one loaded `libnixl_capi.so`.
        pub struct Api {
            pub path: PathBuf,
            $(pub $name: unsafe extern "C" fn($($arg),*) -> Status,)*
        }

        impl Api {
            /// Binds every function from the library at `path`, loaded locally (its UCX must not
            /// serve anyone else's symbols, nor anyone else's UCX serve NIXL's).
            pub fn load(path: &Path) -> Result<Api, NixlError> {
                let c = CString::new(path.as_os_str().as_encoded_bytes())
                    .map_err(|_| NixlError::Nul { what: "the library's path" })?;
                // SAFETY: c is NUL-terminated. The handle is never closed: NIXL's plugins and
                // threads live as long as the process.
                let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                if h.is_null() {
                    return Err(NixlError::Load { path: path.to_owned(), reason: dlerror() });
                }
                Ok(Api {
                    path: path.to_owned(),
                    $($name: {
                        let sym = concat!(stringify!($name), "\0");
                        // SAFETY: h is a live handle; sym is NUL-terminated.
                        let p = unsafe { libc::dlsym(h, sym.as_ptr().cast()) };
                        if p.is_null() {
                            return Err(NixlError::MissingSymbol { path: path.to_owned(), symbol: stringify!($name) });
                        }
                        // SAFETY: the symbol is the C function wrapper.h declares with this
                        // signature (status return, pointer/integer arguments).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> Status>(p) }
                    },)*
                })
            }
        }
    };
}

capi! {
    nixl_capi_create_agent: fn(*const c_char, *mut Handle);
    nixl_capi_destroy_agent: fn(Handle);
    nixl_capi_get_available_plugins: fn(Handle, *mut Handle);
    nixl_capi_string_list_size: fn(Handle, *mut usize);
    nixl_capi_string_list_get: fn(Handle, usize, *mut *const c_char);
    nixl_capi_destroy_string_list: fn(Handle);
    nixl_capi_get_plugin_params: fn(Handle, *const c_char, *mut Handle, *mut Handle);
    nixl_capi_params_add: fn(Handle, *const c_char, *const c_char);
    nixl_capi_destroy_params: fn(Handle);
    nixl_capi_destroy_mem_list: fn(Handle);
    nixl_capi_create_backend: fn(Handle, *const c_char, Handle, *mut Handle);
    nixl_capi_destroy_backend: fn(Handle);
    nixl_capi_create_opt_args: fn(*mut Handle);
    nixl_capi_opt_args_add_backend: fn(Handle, Handle);
    nixl_capi_destroy_opt_args: fn(Handle);
    nixl_capi_create_reg_dlist: fn(c_int, *mut Handle);
    nixl_capi_reg_dlist_add_desc: fn(Handle, usize, usize, u64, *const c_void, usize);
    nixl_capi_destroy_reg_dlist: fn(Handle);
    nixl_capi_register_mem: fn(Handle, Handle, Handle);
    nixl_capi_deregister_mem: fn(Handle, Handle, Handle);
    nixl_capi_get_local_md: fn(Handle, *mut *mut c_void, *mut usize);
    nixl_capi_load_remote_md: fn(Handle, *const c_void, usize, *mut *mut c_char);
    nixl_capi_invalidate_remote_md: fn(Handle, *const c_char);
    nixl_capi_create_xfer_dlist: fn(c_int, *mut Handle);
    nixl_capi_xfer_dlist_add_desc: fn(Handle, usize, usize, u64);
    nixl_capi_destroy_xfer_dlist: fn(Handle);
    nixl_capi_create_xfer_req: fn(Handle, c_int, Handle, Handle, *const c_char, *mut Handle, Handle);
    nixl_capi_post_xfer_req: fn(Handle, Handle, Handle);
    nixl_capi_get_xfer_status: fn(Handle, Handle);
    nixl_capi_release_xfer_req: fn(Handle, Handle);
    nixl_capi_destroy_xfer_req: fn(Handle);
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// A string NIXL returned (borrowed from one of its lists).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives the call.
pub unsafe fn borrowed(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
