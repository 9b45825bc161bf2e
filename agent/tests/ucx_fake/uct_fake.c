/* A stand-in for UCX's libuct_ib_mlx5: exports uct_ib_mlx5_completion_with_err with UCX's
 * signature, so the agent's uprobe can be tested on a machine without RDMA hardware. */
#include <stdint.h>
__attribute__((noinline, visibility("default")))
void uct_ib_mlx5_completion_with_err(void *iface, void *ecqe, void *txwq, int log_level) {
    __asm__ volatile("" : : "r"(iface), "r"(ecqe), "r"(txwq), "r"(log_level) : "memory");
}

/* A stand-in for a transfer API returning a status (NIXL-style: negative is an error). */
__attribute__((noinline, visibility("default")))
int nixl_fake_post_xfer(int status) {
    __asm__ volatile("" : "+r"(status) : : "memory");
    return status;
}
