// pattern.cu compiled for the host, its grid run one thread at a time: the tests check the GPU
// kernels' arithmetic against agent/src/probe/pattern.rs on a machine without a GPU. Not used
// outside the tests.
#define RG_HOST 1
#include "pattern.cu"

#define RG_GRID_LOOP(grid, call)                                                   \
  do {                                                                             \
    rg_h_nctaid = (grid);                                                          \
    for (rg_h_ctaid = 0; rg_h_ctaid < rg_h_nctaid; rg_h_ctaid++)                   \
      for (rg_h_tid = 0; rg_h_tid < RG_BLOCK; rg_h_tid++) call;                    \
  } while (0)

void rg_host_fill(rg_u64 *p, rg_u64 words, rg_u64 nonce, rg_u64 first_word, rg_u32 grid) {
  RG_GRID_LOOP(grid, rg_fill(p, words, nonce, first_word));
}

void rg_host_poison(rg_u64 *p, rg_u64 words, rg_u64 value, rg_u32 grid) {
  RG_GRID_LOOP(grid, rg_poison(p, words, value));
}

void rg_host_check(const rg_u64 *p, rg_u64 words, rg_u64 nonce, rg_u64 first_word, rg_u64 *out, rg_u32 grid) {
  out[0] = 0;
  out[1] = ~0ULL;
  RG_GRID_LOOP(grid, rg_check(p, words, nonce, first_word, out));
}
