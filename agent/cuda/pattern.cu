// The probe pattern's GPU side: fill a source buffer, poison a destination, and compare every
// byte of a received buffer with the pattern made again from the nonce, in GPU memory, so an ok
// probe in GPU memory is never copied to the host (agent/src/probe/gpu.rs loads these).
//
// The pattern is agent/src/probe/pattern.rs's, word for word: word i of the probe with nonce n
// is TABLE[i % 512] ^ key(n, i / 512), TABLE[j] = splitmix64(0x7261696c67756172 ^ j * GOLDEN),
// key(n, b) = splitmix64(n ^ (b + 1) * GOLDEN). A test compiles this same file for the host
// (host.c) and checks it against pattern.rs; build.rs compiles it to PTX with clang.
//
// Launch: blockDim.x = RG_BLOCK (512), any gridDim.x. Each thread handles the words whose index
// is its own modulo 512, so it makes its TABLE word once and one key per 4 KiB block.

#ifdef RG_HOST
#include <stdint.h>
typedef uint64_t rg_u64;
typedef uint32_t rg_u32;
// One thread at a time (host.c runs the grid in a loop): no atomics needed.
static rg_u32 rg_h_tid, rg_h_ctaid, rg_h_nctaid;
#define RG_KERNEL static
#define RG_DEVICE static inline
#define RG_TID() rg_h_tid
#define RG_CTAID() rg_h_ctaid
#define RG_NCTAID() rg_h_nctaid
#define RG_ATOMIC_ADD(p, v) (*(p) += (v))
#define RG_ATOMIC_MIN(p, v) (*(p) = *(p) < (v) ? *(p) : (v))
#else
typedef unsigned long long rg_u64;
typedef unsigned int rg_u32;
#define RG_KERNEL extern "C" __attribute__((global))
#define RG_DEVICE static __attribute__((device)) inline
#define RG_TID() __nvvm_read_ptx_sreg_tid_x()
#define RG_CTAID() __nvvm_read_ptx_sreg_ctaid_x()
#define RG_NCTAID() __nvvm_read_ptx_sreg_nctaid_x()
#define RG_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define RG_ATOMIC_MIN(p, v) __atomic_fetch_min((p), (v), __ATOMIC_RELAXED)
#endif

#define RG_BLOCK 512u
#define RG_GOLDEN 0x9e3779b97f4a7c15ULL

RG_DEVICE rg_u64 rg_splitmix64(rg_u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

RG_DEVICE rg_u64 rg_table(rg_u64 j) { return rg_splitmix64(0x7261696c67756172ULL ^ (j * RG_GOLDEN)); }

RG_DEVICE rg_u64 rg_key(rg_u64 nonce, rg_u64 block) { return rg_splitmix64(nonce ^ ((block + 1) * RG_GOLDEN)); }

// Words first_word .. first_word + words of the probe with `nonce`, into p[0 .. words].
RG_KERNEL void rg_fill(rg_u64 *p, rg_u64 words, rg_u64 nonce, rg_u64 first_word) {
  rg_u64 i = (rg_u64)RG_CTAID() * RG_BLOCK + RG_TID();
  rg_u64 stride = (rg_u64)RG_NCTAID() * RG_BLOCK;
  rg_u64 t = rg_table((first_word + i) % RG_BLOCK);
  for (; i < words; i += stride) {
    rg_u64 w = first_word + i;
    p[i] = t ^ rg_key(nonce, w / RG_BLOCK);
  }
}

// p[0 .. words] = value (the receiver's poison word).
RG_KERNEL void rg_poison(rg_u64 *p, rg_u64 words, rg_u64 value) {
  rg_u64 stride = (rg_u64)RG_NCTAID() * RG_BLOCK;
  for (rg_u64 i = (rg_u64)RG_CTAID() * RG_BLOCK + RG_TID(); i < words; i += stride) p[i] = value;
}

// Compares p[0 .. words] with words first_word .. of the probe's pattern. out[0] += the number
// of words that differ; out[1] = min(out[1], the index of the first that differs). The caller
// sets out to {0, ~0} before the launch.
RG_KERNEL void rg_check(const rg_u64 *p, rg_u64 words, rg_u64 nonce, rg_u64 first_word, rg_u64 *out) {
  rg_u64 i = (rg_u64)RG_CTAID() * RG_BLOCK + RG_TID();
  rg_u64 stride = (rg_u64)RG_NCTAID() * RG_BLOCK;
  rg_u64 t = rg_table((first_word + i) % RG_BLOCK);
  rg_u64 bad = 0, first_bad = ~0ULL;
  for (; i < words; i += stride) {
    rg_u64 w = first_word + i;
    if (p[i] != (t ^ rg_key(nonce, w / RG_BLOCK))) {
      if (bad == 0) first_bad = i;
      bad++;
    }
  }
  if (bad) {
    RG_ATOMIC_ADD(&out[0], bad);
    RG_ATOMIC_MIN(&out[1], first_bad);
  }
}
