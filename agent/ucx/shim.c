/*
 * railguard's bridge to UCX (libucp): open a context with two workers in this process, and
 * move a buffer from one to the other with ucp_put_nbx into memory registered with
 * ucp_mem_map, exactly as a KV-cache transfer does (one-sided RMA, remote key unpacked on the
 * endpoint), then flush so completion means the bytes are remote.
 *
 * libucp is loaded at run time (dlopen), so the agent runs on machines without UCX and says
 * so; the headers are only needed to build. Built without them (RG_HAVE_UCX undefined), every
 * call reports that.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RG_HAVE_UCX
#include <dlfcn.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define FN(name) static __typeof__(&name) p_##name
FN(ucp_config_read);
FN(ucp_config_modify);
FN(ucp_config_release);
FN(ucp_init_version);
FN(ucp_cleanup);
FN(ucp_worker_create);
FN(ucp_worker_destroy);
FN(ucp_worker_get_address);
FN(ucp_worker_release_address);
FN(ucp_worker_progress);
FN(ucp_ep_create);
FN(ucp_ep_close_nbx);
FN(ucp_mem_map);
FN(ucp_mem_unmap);
FN(ucp_rkey_pack);
FN(ucp_rkey_buffer_release);
FN(ucp_ep_rkey_unpack);
FN(ucp_rkey_destroy);
FN(ucp_put_nbx);
FN(ucp_ep_flush_nbx);
FN(ucp_request_check_status);
FN(ucp_request_free);
FN(ucp_request_cancel);
FN(ucs_status_string);
FN(ucp_get_version_string);
FN(ucp_context_query);
FN(ucp_ep_print_info);

static int loaded = 0;
static char load_error[256];

static int load(void) {
    if (loaded) return loaded > 0;
    /* Local: this UCX must not serve its symbols to another UCX in the process (NIXL's own,
     * loaded by the nixl transport), nor take theirs. */
    void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libucp.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof load_error, "libucp is not installed (dlopen: %s)", dlerror());
        loaded = -1;
        return 0;
    }
#define LOAD(name)                                                                      \
    do {                                                                                \
        *(void **)(&p_##name) = dlsym(h, #name);                                        \
        if (!p_##name) {                                                                \
            snprintf(load_error, sizeof load_error, "libucp lacks symbol %s", #name);  \
            loaded = -1;                                                                \
            return 0;                                                                   \
        }                                                                               \
    } while (0)
    LOAD(ucp_config_read); LOAD(ucp_config_modify); LOAD(ucp_config_release);
    LOAD(ucp_init_version); LOAD(ucp_cleanup); LOAD(ucp_worker_create); LOAD(ucp_worker_destroy);
    LOAD(ucp_worker_get_address); LOAD(ucp_worker_release_address); LOAD(ucp_worker_progress);
    LOAD(ucp_ep_create); LOAD(ucp_ep_close_nbx); LOAD(ucp_mem_map); LOAD(ucp_mem_unmap);
    LOAD(ucp_rkey_pack); LOAD(ucp_rkey_buffer_release); LOAD(ucp_ep_rkey_unpack);
    LOAD(ucp_rkey_destroy); LOAD(ucp_put_nbx); LOAD(ucp_ep_flush_nbx);
    LOAD(ucp_request_check_status); LOAD(ucp_request_free); LOAD(ucp_request_cancel);
    LOAD(ucs_status_string); LOAD(ucp_get_version_string); LOAD(ucp_context_query);
    LOAD(ucp_ep_print_info);
    loaded = 1;
    return 1;
}

static void fail(char *err, size_t len, const char *what, ucs_status_t st) {
    snprintf(err, len, "%s: %s", what, p_ucs_status_string ? p_ucs_status_string(st) : "?");
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct rg_ucx {
    ucp_context_h ctx;
    ucp_worker_h sender, receiver;
    ucp_ep_h ep;
    /* Set by UCX's error callback: the endpoint failed (its peer went away). */
    ucs_status_t ep_error;
} rg_ucx;

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    ((rg_ucx *)arg)->ep_error = status;
}

/* The sender's endpoint to the receiver worker, with peer error handling: a peer that goes away
 * fails the operations in flight (reported), instead of aborting the process. */
static ucs_status_t connect_ep(rg_ucx *u, char *err, size_t errlen) {
    ucp_address_t *addr;
    size_t addr_len;
    ucs_status_t st = p_ucp_worker_get_address(u->receiver, &addr, &addr_len);
    if (st != UCS_OK) { fail(err, errlen, "ucp_worker_get_address", st); return st; }
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = u;
    u->ep_error = UCS_OK;
    st = p_ucp_ep_create(u->sender, &ep, &u->ep);
    p_ucp_worker_release_address(u->receiver, addr);
    if (st != UCS_OK) { fail(err, errlen, "ucp_ep_create", st); u->ep = NULL; }
    return st;
}

static void close_ep(rg_ucx *u) {
    if (!u->ep) return;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void *req = p_ucp_ep_close_nbx(u->ep, &rp);
    if (req && UCS_PTR_IS_PTR(req)) {
        double deadline = now_ms() + 1000;
        while (p_ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < deadline) {
            p_ucp_worker_progress(u->sender);
            if (u->receiver) p_ucp_worker_progress(u->receiver);
        }
        p_ucp_request_free(req);
    }
    u->ep = NULL;
}

const char *rg_ucx_version(void) { return load() ? p_ucp_get_version_string() : NULL; }

void rg_ucx_close(rg_ucx *u);

rg_ucx *rg_ucx_open(const char *net_devices, const char *tls, char *err, size_t errlen) {
    if (!load()) {
        snprintf(err, errlen, "%s", load_error);
        return NULL;
    }
    rg_ucx *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    ucp_config_t *config;
    ucs_status_t st = p_ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) { fail(err, errlen, "ucp_config_read", st); free(u); return NULL; }
    if (net_devices && *net_devices) {
        st = p_ucp_config_modify(config, "NET_DEVICES", net_devices);
        if (st != UCS_OK) { fail(err, errlen, "UCX_NET_DEVICES", st); p_ucp_config_release(config); free(u); return NULL; }
    }
    if (tls && *tls) {
        st = p_ucp_config_modify(config, "TLS", tls);
        if (st != UCS_OK) { fail(err, errlen, "UCX_TLS", st); p_ucp_config_release(config); free(u); return NULL; }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    st = p_ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &u->ctx);
    p_ucp_config_release(config);
    if (st != UCS_OK) { fail(err, errlen, "ucp_init", st); free(u); return NULL; }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if ((st = p_ucp_worker_create(u->ctx, &wp, &u->sender)) != UCS_OK ||
        (st = p_ucp_worker_create(u->ctx, &wp, &u->receiver)) != UCS_OK) {
        fail(err, errlen, "ucp_worker_create", st);
        rg_ucx_close(u);
        return NULL;
    }
    if (connect_ep(u, err, errlen) != UCS_OK) { rg_ucx_close(u); return NULL; }
    return u;
}

/* Drives both workers until `req` completes or the deadline passes. 0 ok, 1 error, 2 timeout. */
static int wait_req(rg_ucx *u, void *req, double deadline, const char *what, char *err, size_t errlen) {
    if (req == NULL) return 0;
    if (UCS_PTR_IS_ERR(req)) { fail(err, errlen, what, UCS_PTR_STATUS(req)); return 1; }
    ucs_status_t st;
    while ((st = p_ucp_request_check_status(req)) == UCS_INPROGRESS) {
        p_ucp_worker_progress(u->sender);
        if (u->receiver) p_ucp_worker_progress(u->receiver);
        if (now_ms() > deadline) {
            p_ucp_request_cancel(u->sender, req);
            p_ucp_request_free(req);
            snprintf(err, errlen, "%s: no completion before the deadline", what);
            return 2;
        }
    }
    p_ucp_request_free(req);
    if (st != UCS_OK) { fail(err, errlen, what, st); return 1; }
    return 0;
}

/* 1 when this UCX build moves CUDA memory itself (built with its cuda transports), else 0. */
int rg_ucx_supports_cuda(rg_ucx *u) {
    ucp_context_attr_t attr;
    memset(&attr, 0, sizeof attr);
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (p_ucp_context_query(u->ctx, &attr) != UCS_OK) return 0;
    return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

/* `cuda`: src and dst are CUDA device addresses (only when rg_ucx_supports_cuda said so). */
/* `sabotage` 1: the receiving worker is closed once the put is on its way (its peer goes away
 * mid-transfer, as a crashed decode process would); the put or its flush must fail. The
 * receiver and the endpoint are made again afterwards for the next probe. */
int rg_ucx_put(rg_ucx *u, const void *src, void *dst, size_t len, int cuda, int timeout_ms, int sabotage, char *err, size_t errlen) {
    double deadline = now_ms() + timeout_ms;
    if (!u->ep && connect_ep(u, err, errlen) != UCS_OK) return 1;
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = dst;
    mp.length = len;
    if (cuda) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    ucp_mem_h memh;
    ucs_status_t st = p_ucp_mem_map(u->ctx, &mp, &memh);
    if (st != UCS_OK) { fail(err, errlen, "ucp_mem_map", st); return 1; }
    void *rkey_buf;
    size_t rkey_len;
    int rc = 1;
    if ((st = p_ucp_rkey_pack(u->ctx, memh, &rkey_buf, &rkey_len)) != UCS_OK) {
        fail(err, errlen, "ucp_rkey_pack", st);
        goto unmap;
    }
    ucp_rkey_h rkey;
    st = p_ucp_ep_rkey_unpack(u->ep, rkey_buf, &rkey);
    p_ucp_rkey_buffer_release(rkey_buf);
    if (st != UCS_OK) { fail(err, errlen, "ucp_ep_rkey_unpack", st); goto unmap; }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    if (cuda) {
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        rp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    void *put = p_ucp_put_nbx(u->ep, src, len, (uint64_t)(uintptr_t)dst, rkey, &rp);
    if (sabotage == 1) {
        /* A few rounds of progress so the transfer is under way, then the peer is gone. */
        for (int i = 0; i < 4; i++) p_ucp_worker_progress(u->sender);
        p_ucp_worker_destroy(u->receiver);
        u->receiver = NULL;
    }
    rc = wait_req(u, put, deadline, "ucp_put_nbx", err, errlen);
    if (rc == 0) {
        /* put completion frees the source only; the flush makes the data remote. */
        memset(&rp, 0, sizeof rp);
        rc = wait_req(u, p_ucp_ep_flush_nbx(u->ep, &rp), deadline, "ucp_ep_flush_nbx", err, errlen);
    }
    p_ucp_rkey_destroy(rkey);
    if (rc == 0 && u->ep_error != UCS_OK) {
        fail(err, errlen, "the endpoint failed", u->ep_error);
        rc = 1;
    }
    if (rc == 0 && sabotage == 1) {
        snprintf(err, errlen, "UCX reported success for a put whose receiving worker was closed mid-transfer");
    }
unmap:
    p_ucp_mem_unmap(u->ctx, memh);
    if (sabotage == 1 || u->ep_error != UCS_OK) {
        /* Make the receiving side again: a new worker and a new endpoint to it. */
        close_ep(u);
        if (!u->receiver) {
            ucp_worker_params_t wp;
            memset(&wp, 0, sizeof wp);
            wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
            wp.thread_mode = UCS_THREAD_MODE_SINGLE;
            if (p_ucp_worker_create(u->ctx, &wp, &u->receiver) != UCS_OK) u->receiver = NULL;
        }
        char e2[256];
        if (u->receiver) connect_ep(u, e2, sizeof e2);
    }
    return rc;
}

void rg_ucx_close(rg_ucx *u) {
    if (!u) return;
    if (u->sender) close_ep(u);
    if (u->sender) p_ucp_worker_destroy(u->sender);
    if (u->receiver) p_ucp_worker_destroy(u->receiver);
    if (u->ctx) p_ucp_cleanup(u->ctx);
    free(u);
}

/* The endpoint's lanes as UCX prints them (ucp_ep_print_info): which transport and device each
 * lane uses, and for what (am, rma, rma_bw, ...). UCX 1.13 has no ucp_ep_query field for this.
 * Returns 0 and NUL-terminated text in `out`, or 1. */
int rg_ucx_lanes(rg_ucx *u, char *out, size_t len) {
    if (len == 0 || !u->ep) return 1;
    out[0] = 0;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return 1;
    p_ucp_ep_print_info(u->ep, f);
    fclose(f);
    snprintf(out, len, "%s", buf ? buf : "");
    free(buf);
    return 0;
}

#else /* built without UCX headers */

typedef struct rg_ucx rg_ucx;
const char *rg_ucx_version(void) { return NULL; }
rg_ucx *rg_ucx_open(const char *net_devices, const char *tls, char *err, size_t errlen) {
    (void)net_devices; (void)tls;
    snprintf(err, errlen, "this agent was built without UCX headers (install libucx-dev and rebuild)");
    return NULL;
}
int rg_ucx_supports_cuda(rg_ucx *u) { (void)u; return 0; }
int rg_ucx_put(rg_ucx *u, const void *src, void *dst, size_t len, int cuda, int timeout_ms, int sabotage, char *err, size_t errlen) {
    (void)u; (void)src; (void)dst; (void)len; (void)cuda; (void)timeout_ms; (void)sabotage;
    snprintf(err, errlen, "UCX unavailable");
    return 1;
}
int rg_ucx_lanes(rg_ucx *u, char *out, size_t len) { (void)u; if (len) out[0] = 0; return 1; }
void rg_ucx_close(rg_ucx *u) { (void)u; }
#endif
