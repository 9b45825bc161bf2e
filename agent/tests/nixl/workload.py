"""A NIXL workload for railguard's tests: the PyPI wheel's C API through ctypes (no numpy),
two NIXL agents with the UCX backend in this process, good READs, then a READ whose remote
agent was invalidated after the request was made (NIXL counts it as a transfer error in its
telemetry). Prints `ready` and waits, so its telemetry ring stays mapped.

Usage: workload.py LIBNIXL_CAPI [SECONDS]. The NIXL agents use UCX_NET_DEVICES=lo,
UCX_TLS=tcp set here, after start: the environment the process started with (what
/proc/PID/environ shows, and railguard reads) keeps the pin the test gave it.
"""
import ctypes
import os
import sys
import time

os.environ["UCX_NET_DEVICES"] = "lo"
os.environ["UCX_TLS"] = "tcp"
lib = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p


def ok(rc, what):
    if rc != 0:
        raise SystemExit(f"{what}: NIXL status {rc}")


def agent(name):
    a = P()
    ok(lib.nixl_capi_create_agent(name.encode(), ctypes.byref(a)), "create_agent")
    mems, params, backend = P(), P(), P()
    ok(lib.nixl_capi_get_plugin_params(a, b"UCX", ctypes.byref(mems), ctypes.byref(params)), "plugin_params")
    ok(lib.nixl_capi_create_backend(a, b"UCX", params, ctypes.byref(backend)), "create_backend")
    return a


def register(a, buf):
    d = P()
    ok(lib.nixl_capi_create_reg_dlist(0, ctypes.byref(d)), "reg_dlist")
    ok(lib.nixl_capi_reg_dlist_add_desc(d, ctypes.c_size_t(ctypes.addressof(buf)), ctypes.c_size_t(len(buf)),
                                        ctypes.c_uint64(0), None, ctypes.c_size_t(0)), "add_desc")
    ok(lib.nixl_capi_register_mem(a, d, None), "register_mem")


def xlist(buf):
    d = P()
    ok(lib.nixl_capi_create_xfer_dlist(0, ctypes.byref(d)), "xfer_dlist")
    ok(lib.nixl_capi_xfer_dlist_add_desc(d, ctypes.c_size_t(ctypes.addressof(buf)), ctypes.c_size_t(len(buf)),
                                         ctypes.c_uint64(0)), "xfer add_desc")
    return d


prefill, decode = agent("wl-prefill"), agent("wl-decode")
src = (ctypes.c_char * (1 << 20))(*([b"k"] * (1 << 20)))
dst = (ctypes.c_char * (1 << 20))()
register(prefill, src)
register(decode, dst)


def load():
    md, n, name = P(), ctypes.c_size_t(), ctypes.c_char_p()
    ok(lib.nixl_capi_get_local_md(prefill, ctypes.byref(md), ctypes.byref(n)), "get_local_md")
    ok(lib.nixl_capi_load_remote_md(decode, md, n, ctypes.byref(name)), "load_remote_md")


def read(invalidate_first=False):
    req = P()
    ok(lib.nixl_capi_create_xfer_req(decode, 0, xlist(dst), xlist(src), b"wl-prefill", ctypes.byref(req), None),
       "create_xfer_req")
    if invalidate_first:
        lib.nixl_capi_invalidate_remote_md(decode, b"wl-prefill")
    st = lib.nixl_capi_post_xfer_req(decode, req, None)
    while st == 1:
        st = lib.nixl_capi_get_xfer_status(decode, req)
    return st


load()
for _ in range(2):
    ok(read(), "READ")
assert dst.raw == src.raw
failed = read(invalidate_first=True)
print(f"ready (failed READ: NIXL status {failed})", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 30)
os._exit(0)  # NIXL's libraries crash in their destructors at exit()
