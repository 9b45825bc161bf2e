//! Safe wrappers over NIXL's C API for what one probe needs: an agent with its UCX backend
//! ([`Agent`]), a memory region registered for the length of a probe ([`Registered`]), and a
//! list of KV-block descriptors ([`XferList`]). Each owns its NIXL handle and frees it once.
#![allow(unsafe_code)] // calls into NIXL's C API through capi::Api; each call is wrapped here

use std::ffi::{CString, c_char, c_int, c_void};

use super::capi::{self, Api, Handle, Status};
use super::error::NixlError;

/// One NIXL agent with its UCX backend.
pub(super) struct Agent {
    api: &'static Api,
    pub(super) h: Handle,
    pub(super) name: CString,
}

impl Agent {
    pub(super) fn new(api: &'static Api, name: String) -> Result<Agent, NixlError> {
        let name = CString::new(name).map_err(|_| NixlError::Nul { what: "the agent's name" })?;
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: name is NUL-terminated; h receives the new agent.
        NixlError::check("nixl_capi_create_agent", unsafe { (api.nixl_capi_create_agent)(name.as_ptr(), &mut h) })?;
        let agent = Agent { api, h, name };
        agent.ucx_backend()?;
        Ok(agent)
    }

    fn plugins(&self) -> Vec<String> {
        let mut list: Handle = std::ptr::null_mut();
        let mut out = Vec::new();
        // SAFETY: h is live; list receives a string list destroyed below.
        if unsafe { (self.api.nixl_capi_get_available_plugins)(self.h, &mut list) } != capi::SUCCESS {
            return out;
        }
        let mut n = 0usize;
        // SAFETY: list is live.
        if unsafe { (self.api.nixl_capi_string_list_size)(list, &mut n) } == capi::SUCCESS {
            for i in 0..n {
                let mut p: *const c_char = std::ptr::null();
                // SAFETY: i < n; p borrows from list, copied before list is destroyed.
                if unsafe { (self.api.nixl_capi_string_list_get)(list, i, &mut p) } == capi::SUCCESS {
                    out.push(unsafe { capi::borrowed(p) });
                }
            }
        }
        // SAFETY: list came from get_available_plugins and is destroyed once.
        unsafe { (self.api.nixl_capi_destroy_string_list)(list) };
        out
    }

    fn ucx_backend(&self) -> Result<(), NixlError> {
        let ucx = c"UCX";
        let (mut mems, mut params): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: h is live; mems/params receive lists destroyed below.
        let s = unsafe { (self.api.nixl_capi_get_plugin_params)(self.h, ucx.as_ptr(), &mut mems, &mut params) };
        if s != capi::SUCCESS {
            return Err(NixlError::NoUcxPlugin { status: s, plugins: self.plugins() });
        }
        let mut backend: Handle = std::ptr::null_mut();
        // SAFETY: params is live; backend receives a handle wrapper (the engine stays the
        // agent's), freed at once.
        let s = unsafe { (self.api.nixl_capi_create_backend)(self.h, ucx.as_ptr(), params, &mut backend) };
        // SAFETY: each destroyed once; backend only if created.
        unsafe {
            (self.api.nixl_capi_destroy_params)(params);
            (self.api.nixl_capi_destroy_mem_list)(mems);
            if !backend.is_null() {
                (self.api.nixl_capi_destroy_backend)(backend);
            }
        }
        NixlError::check("creating NIXL's UCX backend", s)
    }

    /// This agent's metadata, loaded by `peer`.
    pub(super) fn publish_to(&self, peer: &Agent) -> Result<(), NixlError> {
        let (mut data, mut len): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: h is live; data receives a malloc'd blob freed below.
        NixlError::check("nixl_capi_get_local_md", unsafe {
            (self.api.nixl_capi_get_local_md)(self.h, &mut data, &mut len)
        })?;
        let mut name: *mut c_char = std::ptr::null_mut();
        // SAFETY: data is len bytes; name receives a strdup'd string freed below.
        let s = unsafe { (self.api.nixl_capi_load_remote_md)(peer.h, data, len, &mut name) };
        // SAFETY: both were allocated with malloc by NIXL's C API.
        unsafe {
            libc::free(data);
            if !name.is_null() {
                libc::free(name.cast());
            }
        }
        NixlError::check("loading the remote agent's metadata", s)
    }

    /// Forgets `peer`'s metadata (and disconnects from it).
    pub(super) fn forget(&self, peer: &Agent) -> Status {
        // SAFETY: both live; the name is NUL-terminated.
        unsafe { (self.api.nixl_capi_invalidate_remote_md)(self.h, peer.name.as_ptr()) }
    }

    pub(super) fn name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: h came from create_agent and is destroyed once.
        unsafe { (self.api.nixl_capi_destroy_agent)(self.h) };
    }
}

/// A memory region registered with an agent for the length of one probe.
pub(super) struct Registered<'a> {
    agent: &'a Agent,
    list: Handle,
}

impl<'a> Registered<'a> {
    pub(super) fn new(
        agent: &'a Agent,
        mem: c_int,
        addr: u64,
        len: usize,
        dev: u64,
    ) -> Result<Registered<'a>, NixlError> {
        let api = agent.api;
        let mut list: Handle = std::ptr::null_mut();
        // SAFETY: list receives a descriptor list destroyed in Drop (or below on failure).
        NixlError::check("nixl_capi_create_reg_dlist", unsafe { (api.nixl_capi_create_reg_dlist)(mem, &mut list) })?;
        // SAFETY: list is live; the region is valid for len bytes while registered (the
        // caller's buffers outlive the probe).
        let s = unsafe { (api.nixl_capi_reg_dlist_add_desc)(list, addr as usize, len, dev, std::ptr::null(), 0) };
        let s = if s == capi::SUCCESS {
            // SAFETY: as above.
            unsafe { (api.nixl_capi_register_mem)(agent.h, list, std::ptr::null_mut()) }
        } else {
            s
        };
        if s != capi::SUCCESS {
            // SAFETY: created above, destroyed once.
            unsafe { (api.nixl_capi_destroy_reg_dlist)(list) };
            return Err(NixlError::Call {
                what: format!("registering {len} bytes with NIXL agent {}", agent.name()),
                status: s,
            });
        }
        Ok(Registered { agent, list })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let api = self.agent.api;
        // SAFETY: registered in new(); deregistered and destroyed once.
        unsafe {
            (api.nixl_capi_deregister_mem)(self.agent.h, self.list, std::ptr::null_mut());
            (api.nixl_capi_destroy_reg_dlist)(self.list);
        }
    }
}

/// A transfer descriptor list: `len` bytes from `addr` in `block`-sized descriptors.
pub(super) struct XferList {
    api: &'static Api,
    pub(super) h: Handle,
}

impl XferList {
    pub(super) fn blocks(
        api: &'static Api,
        mem: c_int,
        addr: u64,
        blocks: &[(usize, usize)],
        dev: u64,
    ) -> Result<XferList, NixlError> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: h receives a list destroyed in Drop.
        NixlError::check("nixl_capi_create_xfer_dlist", unsafe { (api.nixl_capi_create_xfer_dlist)(mem, &mut h) })?;
        let list = XferList { api, h };
        for &(off, len) in blocks {
            // SAFETY: h is live; the block lies within the registered region.
            NixlError::check("nixl_capi_xfer_dlist_add_desc", unsafe {
                (api.nixl_capi_xfer_dlist_add_desc)(h, addr as usize + off, len, dev)
            })?;
        }
        Ok(list)
    }
}

impl Drop for XferList {
    fn drop(&mut self) {
        // SAFETY: created in blocks(), destroyed once.
        unsafe { (self.api.nixl_capi_destroy_xfer_dlist)(self.h) };
    }
}
