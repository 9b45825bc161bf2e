/*
 * A test double for libcuda.so (the CUDA driver API), used only by railguard's tests on
 * machines without a GPU. "Device memory" is host memory; copies are memcpy. It implements
 * just the calls railguard's probe engine makes through cudarc, so the engine's GPU-memory
 * path (allocate, upload, transfer device to device, download, verify) runs end to end. It
 * proves railguard's plumbing, not a GPU: the real thing is checked by scripts/device-check.sh.
 *
 * RAILGUARD_FAKE_CUDA_BDF: the one device's PCI address (default 0000:00:00.0).
 * RAILGUARD_FAKE_CUDA_DMABUF=1: claim dma-buf support, and export a memfd (which is not a
 * dma-buf, so a NIC's ibv_reg_dmabuf_mr refuses it: the fallback path gets exercised).
 * RAILGUARD_FAKE_CUDA_COUNTS: a file to which the number of host<->device copies is written
 * at every synchronize (so a test can see that the bytes went through "device" memory).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101, NOT_SUPPORTED = 801 };

static unsigned long htod, dtoh;
static int ctx_current = 0;

static void bdf(unsigned *dom, unsigned *bus, unsigned *dev) {
    const char *s = getenv("RAILGUARD_FAKE_CUDA_BDF");
    unsigned fn = 0;
    *dom = *bus = *dev = 0;
    if (s) sscanf(s, "%x:%x:%x.%x", dom, bus, dev, &fn);
}

static void counts(void) {
    const char *p = getenv("RAILGUARD_FAKE_CUDA_COUNTS");
    if (!p) return;
    FILE *f = fopen(p, "w");
    if (!f) return;
    fprintf(f, "htod=%lu dtoh=%lu\n", htod, dtoh);
    fclose(f);
}

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, (size_t)len, "railguard fake CUDA device (test double)");
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    unsigned dom, bus, dev;
    (void)d;
    bdf(&dom, &bus, &dev);
    switch (attr) {
    case 33: *v = (int)bus; break;  /* PCI_BUS_ID */
    case 34: *v = (int)dev; break;  /* PCI_DEVICE_ID */
    case 50: *v = (int)dom; break;  /* PCI_DOMAIN_ID */
    case 124: *v = getenv("RAILGUARD_FAKE_CUDA_DMABUF") != NULL; break; /* DMA_BUF_SUPPORTED */
    default: *v = 0;                /* no memory pools, ... */
    }
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)(uintptr_t)(0x1000 + d); return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { ctx_current = c != 0; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = ctx_current ? (CUcontext)(uintptr_t)0x1000 : 0; return OK; }
CUresult cuCtxSynchronize(void) { counts(); return OK; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    void *m = NULL;
    if (posix_memalign(&m, 2u << 20, n ? n : 1) != 0) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)s;
    memset((void *)(uintptr_t)p, v, n);
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    memcpy((void *)(uintptr_t)dst, src, n);
    htod++;
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    dtoh++;
    return OK;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; counts(); return OK; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { (void)s; (void)e; (void)f; return OK; }
CUresult cuEventCreate(CUevent *e, unsigned f) { (void)f; *e = malloc(1); return *e ? OK : OUT_OF_MEMORY; }
CUresult cuEventRecord(CUevent e, CUstream s) { (void)e; (void)s; return OK; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return OK; }
CUresult cuEventQuery(CUevent e) { (void)e; return OK; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return OK; }
CUresult cuMemGetHandleForAddressRange(void *h, CUdeviceptr p, size_t n, int type, unsigned long long f) {
    (void)p; (void)n; (void)f;
    if (!getenv("RAILGUARD_FAKE_CUDA_DMABUF") || type != 1) return NOT_SUPPORTED;
    *(int *)h = memfd_create("railguard-fake-dmabuf", MFD_CLOEXEC);
    return *(int *)h >= 0 ? OK : OUT_OF_MEMORY;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
    *s = r == OK ? "CUDA_SUCCESS" : r == INVALID_DEVICE ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_FAKE";
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) { return cuGetErrorName(r, s); }
