/* Event layouts shared by the kernel programs (railguard.bpf.c) and the agent
 * (agent/src/signals/ebpf/events.rs mirrors them; its test parses this file and compares every
 * field's offset). No hidden padding: every field is sized and aligned explicitly. Keep one
 * declaration per line, `__u32 name;` or `__u8 name[N];`: the test reads that shape. */
#ifndef RAILGUARD_EVENTS_H
#define RAILGUARD_EVENTS_H

/* Event kinds, numbered by category as the wire schema's SignalKind. */
#define RG_EV_UCX_ERROR_CQE 100
#define RG_EV_STATUS_RETURN 102
#define RG_EV_TRACEPOINT 200 /* raw tracepoint record; decoded with the format file */

#define RG_CQE_BYTES 64
#define RG_RAW_BYTES 256

struct rg_ucx_cqe_event {
    __u32 kind;        /* RG_EV_UCX_ERROR_CQE */
    __u32 pid;         /* thread group id */
    __u32 tid;
    __s32 log_level;   /* UCX calls twice per requester error: DEBUG, then the failure level */
    __u64 ktime_ns;
    __u8 cqe[RG_CQE_BYTES]; /* struct mlx5_err_cqe as the NIC wrote it */
    __u64 cookie;      /* which attached library fired (the agent's attach list) */
};

struct rg_tracepoint_event {
    __u32 kind;        /* RG_EV_TRACEPOINT */
    __u32 tp;          /* which tracepoint: index in the loader's list */
    __u32 len;         /* bytes of raw that are valid */
    __u32 pad;
    __u64 ktime_ns;
    __u8 raw[RG_RAW_BYTES]; /* the trace record from offset 0 (common fields included) */
};

struct rg_status_event {
    __u32 kind;        /* RG_EV_STATUS_RETURN */
    __u32 pid;
    __u32 tid;
    __u32 pad;
    __u64 ktime_ns;
    __s64 status;      /* the function's (negative) return value */
    __u64 cookie;      /* which attached library fired (the agent's attach list) */
};

#endif
