/* Benchmark driver: N requester errors, each reported twice as UCX does. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
void uct_ib_mlx5_completion_with_err(void *iface, void *ecqe, void *txwq, int log_level);
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    uint8_t c[64];
    memset(c, 0, 64);
    c[55] = 0x04;
    c[63] = 13 << 4;
    for (long i = 0; i < n; i++) {
        uint32_t qpn = (uint32_t)i & 0xffffff;
        c[57] = qpn >> 16; c[58] = qpn >> 8; c[59] = qpn;
        c[60] = (i >> 8) & 0xff; c[61] = i & 0xff;
        uct_ib_mlx5_completion_with_err((void *)1, c, (void *)2, 5);
        uct_ib_mlx5_completion_with_err((void *)1, c, (void *)2, 1);
    }
    return 0;
}
