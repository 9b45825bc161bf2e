/* Calls the fake UCX function as UCX does: twice per requester error (DEBUG, then ERROR),
 * with crafted 64-byte mlx5 error CQEs (docs/how-railguard-decides.md §5 offsets). */
#include <stdint.h>
#include <string.h>
void uct_ib_mlx5_completion_with_err(void *iface, void *ecqe, void *txwq, int log_level);

static void cqe(uint8_t *c, uint8_t syndrome, uint8_t vendor, uint32_t qpn, uint8_t opcode, uint16_t wqe) {
    memset(c, 0, 64);
    c[52] = 0x01;            /* hw_err_synd */
    c[53] = 0x30;            /* hw_synd_type << 4 */
    c[54] = vendor;          /* vendor_err_synd */
    c[55] = syndrome;
    uint32_t sqo = ((uint32_t)opcode << 24) | (qpn & 0xffffff);
    c[56] = sqo >> 24; c[57] = sqo >> 16; c[58] = sqo >> 8; c[59] = sqo;
    c[60] = wqe >> 8; c[61] = wqe;
    c[63] = 13 << 4;         /* requester error */
}

int main(void) {
    uint8_t c[64];
    struct { uint8_t s, v; uint32_t qpn; uint8_t op; uint16_t wqe; } errs[3] = {
        {0x04, 0x32, 0x2c8, 0x0d, 7}, {0x13, 0x88, 0x2c9, 0x08, 8}, {0x15, 0x81, 0x2ca, 0x0a, 9}};
    for (int i = 0; i < 3; i++) {
        cqe(c, errs[i].s, errs[i].v, errs[i].qpn, errs[i].op, errs[i].wqe);
        uct_ib_mlx5_completion_with_err((void *)1, c, (void *)2, 5 /* DEBUG */);
        uct_ib_mlx5_completion_with_err((void *)1, c, (void *)2, 1 /* ERROR */);
    }
    return 0;
}
