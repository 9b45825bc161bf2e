// SPDX-License-Identifier: GPL-2.0
/* railguard's kernel-side programs. Thin: they copy what the kernel or UCX hands them into a
 * ring buffer; the agent decodes (tracepoint fields with the format files read at run time,
 * the mlx5 error CQE with the offsets of docs/how-railguard-decides.md §5), deduplicates and attributes. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "railguard_events.h"

char LICENSE[] SEC("license") = "GPL";

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} EVENTS SEC(".maps");

/* uct_ib_mlx5_completion_with_err(iface, ecqe, txwq, log_level) (docs/how-railguard-decides.md §5). */
SEC("uprobe")
int ucx_completion_with_err(struct pt_regs *ctx)
{
    struct rg_ucx_cqe_event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
    if (!e)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    e->kind = RG_EV_UCX_ERROR_CQE;
    e->pid = id >> 32;
    e->tid = (__u32)id;
    e->log_level = (__s32)PT_REGS_PARM4(ctx);
    e->ktime_ns = bpf_ktime_get_ns();
    if (bpf_probe_read_user(e->cqe, sizeof(e->cqe), (void *)PT_REGS_PARM2(ctx)) != 0)
        __builtin_memset(e->cqe, 0, sizeof(e->cqe));
    e->cookie = bpf_get_attach_cookie(ctx);
    bpf_ringbuf_submit(e, 0);
    return 0;
}

/* Return-status targets (e.g. NIXL calls): a negative return is an error; the attach cookie
 * says which attached library (and so which target of the agent's list) it was. */
SEC("uretprobe")
int status_return(struct pt_regs *ctx)
{
    long rc = (long)(int)PT_REGS_RC(ctx);
    if (rc >= 0)
        return 0;
    struct rg_status_event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
    if (!e)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    e->kind = RG_EV_STATUS_RETURN;
    e->pid = id >> 32;
    e->tid = (__u32)id;
    e->pad = 0;
    e->ktime_ns = bpf_ktime_get_ns();
    e->status = rc;
    e->cookie = bpf_get_attach_cookie(ctx);
    bpf_ringbuf_submit(e, 0);
    return 0;
}

static __always_inline int copy_record(void *ctx, __u32 tp)
{
    struct rg_tracepoint_event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
    if (!e)
        return 0;
    e->kind = RG_EV_TRACEPOINT;
    e->tp = tp;
    e->pad = 0;
    e->ktime_ns = bpf_ktime_get_ns();
    /* The record's length is not known here: take the largest prefix that reads. */
    if (bpf_probe_read_kernel(e->raw, RG_RAW_BYTES, ctx) == 0)
        e->len = RG_RAW_BYTES;
    else if (bpf_probe_read_kernel(e->raw, 128, ctx) == 0)
        e->len = 128;
    else if (bpf_probe_read_kernel(e->raw, 64, ctx) == 0)
        e->len = 64;
    else
        e->len = 0;
    bpf_ringbuf_submit(e, 0);
    return 0;
}

SEC("tracepoint/iommu/io_page_fault")
int tp_iommu_io_page_fault(void *ctx) { return copy_record(ctx, 0); }

SEC("tracepoint/ras/aer_event")
int tp_ras_aer_event(void *ctx) { return copy_record(ctx, 1); }

SEC("tracepoint/devlink/devlink_health_report")
int tp_devlink_health_report(void *ctx) { return copy_record(ctx, 2); }
