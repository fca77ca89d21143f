/* What CUDA in a container sees: the driver API's device count, and each device's name, UUID and
 * memory, printed one line each for the harness to parse.
 *
 * libcuda is opened with dlopen rather than linked, so the binary builds with the plain gcc of any
 * machine (no CUDA toolkit) and runs in a container that has no driver at all: a pod without a GPU
 * claim gets no libcuda from CDI, and then honestly reports zero devices. Output:
 *   cuda-driver: <version>|none (<why>)
 *   cuda-devices: <n>
 *   cuda-device <i>: uuid=GPU-... memory=<bytes> name=<name>
 *
 * Then, for the share and telemetry checks, what a workload does on the first device it sees:
 *   gpucheck alloc STEP_MIB      allocate in steps until an allocation fails, report how much it
 *                                got and the error that stopped it, then hold the memory:
 *                                  alloc: allocated_mib=<n> stopped_by=<error> total_mib=<n>
 *   gpucheck load MIB            hold MIB and keep the SMs busy (a PTX kernel the driver
 *                                compiles, so still no CUDA toolkit): load: running mib=<n>
 *   gpucheck hold MIB            hold MIB and launch nothing (an idle workload): hold: mib=<n>
 * Each holds until the container is stopped.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

typedef CUresult (*cuInit_t)(unsigned int);
typedef CUresult (*cuDriverGetVersion_t)(int *);
typedef CUresult (*cuDeviceGetCount_t)(int *);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuDeviceGetName_t)(char *, int, CUdevice);
typedef CUresult (*cuDeviceGetUuid_t)(CUuuid *, CUdevice);
typedef CUresult (*cuDeviceTotalMem_t)(size_t *, CUdevice);
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*cuCtxCreate_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*cuMemAlloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemGetInfo_t)(size_t *, size_t *);
typedef CUresult (*cuGetErrorName_t)(CUresult, const char **);
typedef CUresult (*cuModuleLoadData_t)(CUmodule *, const void *);
typedef CUresult (*cuModuleGetFunction_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*cuLaunchKernel_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, void *, void **, void **);
typedef CUresult (*cuCtxSynchronize_t)(void);

#define MIB ((size_t)1 << 20)
#define SPIN_BLOCKS 2048
#define SPIN_THREADS 256
#define SPIN_ROUNDS (1u << 22)

/* Each thread iterates a linear congruential step SPIN_ROUNDS times and stores the result, so
 * the loop cannot be folded away. PTX for the oldest target any current driver still JITs. */
static const char SPIN_PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 out, .param .u32 rounds)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<4>;\n"
    "  .reg .b64 %rd<3>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [rounds];\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mov.u32 %r3, 0;\n"
    "LOOP:\n"
    "  mad.lo.u32 %r2, %r2, 1664525, 1013904223;\n"
    "  add.u32 %r3, %r3, 1;\n"
    "  setp.lt.u32 %p, %r3, %r1;\n"
    "  @%p bra LOOP;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  st.global.u32 [%rd2], %r2;\n"
    "  ret;\n"
    "}\n";

static void *need(void *lib, const char *name) {
    void *fn = dlsym(lib, name);
    if (fn == NULL) {
        printf("cuda-error: libcuda lacks %s\n", name);
    }
    return fn;
}

static void print_uuid(const CUuuid *uuid) {
    const unsigned char *b = uuid->bytes;
    printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
}

static const char *error_name(void *lib, CUresult rc) {
    cuGetErrorName_t cuGetErrorName = (cuGetErrorName_t)dlsym(lib, "cuGetErrorName");
    const char *name = NULL;
    if (cuGetErrorName == NULL || cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL) {
        return "CUDA_ERROR_UNKNOWN";
    }
    return name;
}

static void hold_forever(void) {
    fflush(stdout);
    for (;;) {
        pause();
    }
}

/* Allocates `mib` MiB on the current context, in one piece; 0 on success. */
static int allocate(void *lib, size_t mib) {
    cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)need(lib, "cuMemAlloc_v2");
    CUdeviceptr ptr = 0;
    CUresult rc = cuMemAlloc ? cuMemAlloc(&ptr, mib * MIB) : -1;
    if (rc != CUDA_SUCCESS) {
        printf("cuda-error: allocating %zu MiB: %s\n", mib, error_name(lib, rc));
        return 3;
    }
    return 0;
}

static int workload(void *lib, CUdevice dev, const char *mode, size_t amount) {
    cuCtxCreate_t cuCtxCreate = (cuCtxCreate_t)need(lib, "cuCtxCreate_v2");
    CUcontext ctx = NULL;
    CUresult rc = cuCtxCreate ? cuCtxCreate(&ctx, 0, dev) : -1;
    if (rc != CUDA_SUCCESS) {
        printf("cuda-error: cuCtxCreate: %s\n", error_name(lib, rc));
        return 3;
    }
    if (strcmp(mode, "alloc") == 0) {
        cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)need(lib, "cuMemAlloc_v2");
        cuMemGetInfo_t cuMemGetInfo = (cuMemGetInfo_t)need(lib, "cuMemGetInfo_v2");
        if (!cuMemAlloc || !cuMemGetInfo) {
            return 2;
        }
        size_t total = 0;
        for (;;) {
            CUdeviceptr ptr = 0;
            rc = cuMemAlloc(&ptr, amount * MIB);
            if (rc != CUDA_SUCCESS) {
                break;
            }
            total += amount;
        }
        size_t free_b = 0, total_b = 0;
        cuMemGetInfo(&free_b, &total_b);
        printf("alloc: allocated_mib=%zu stopped_by=%s total_mib=%zu\n", total,
               error_name(lib, rc), total_b / MIB);
        hold_forever();
    }
    if (allocate(lib, amount) != 0) {
        return 3;
    }
    if (strcmp(mode, "hold") == 0) {
        printf("hold: mib=%zu\n", amount);
        hold_forever();
    }
    cuModuleLoadData_t cuModuleLoadData = (cuModuleLoadData_t)need(lib, "cuModuleLoadData");
    cuModuleGetFunction_t cuModuleGetFunction =
        (cuModuleGetFunction_t)need(lib, "cuModuleGetFunction");
    cuLaunchKernel_t cuLaunchKernel = (cuLaunchKernel_t)need(lib, "cuLaunchKernel");
    cuCtxSynchronize_t cuCtxSynchronize = (cuCtxSynchronize_t)need(lib, "cuCtxSynchronize");
    cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)need(lib, "cuMemAlloc_v2");
    if (!cuModuleLoadData || !cuModuleGetFunction || !cuLaunchKernel || !cuCtxSynchronize ||
        !cuMemAlloc) {
        return 2;
    }
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUdeviceptr out = 0;
    if ((rc = cuModuleLoadData(&module, SPIN_PTX)) != CUDA_SUCCESS ||
        (rc = cuModuleGetFunction(&spin, module, "spin")) != CUDA_SUCCESS ||
        (rc = cuMemAlloc(&out, sizeof(unsigned))) != CUDA_SUCCESS) {
        printf("cuda-error: loading the load kernel: %s\n", error_name(lib, rc));
        return 3;
    }
    unsigned rounds = SPIN_ROUNDS;
    void *params[] = {&out, &rounds};
    printf("load: running mib=%zu\n", amount);
    fflush(stdout);
    for (;;) {
        rc = cuLaunchKernel(spin, SPIN_BLOCKS, 1, 1, SPIN_THREADS, 1, 1, 0, NULL, params, NULL);
        if (rc == CUDA_SUCCESS) {
            rc = cuCtxSynchronize();
        }
        if (rc != CUDA_SUCCESS) {
            printf("cuda-error: load kernel: %s\n", error_name(lib, rc));
            return 3;
        }
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[1] : NULL;
    if (mode != NULL && strcmp(mode, "alloc") && strcmp(mode, "load") && strcmp(mode, "hold")) {
        printf("usage: gpucheck [alloc STEP_MIB | load MIB | hold MIB]\n");
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("cuda-driver: none (%s)\ncuda-devices: 0\n", dlerror());
        return mode == NULL ? 0 : 3;
    }
    cuInit_t cuInit = (cuInit_t)need(lib, "cuInit");
    cuDriverGetVersion_t cuDriverGetVersion = (cuDriverGetVersion_t)need(lib, "cuDriverGetVersion");
    cuDeviceGetCount_t cuDeviceGetCount = (cuDeviceGetCount_t)need(lib, "cuDeviceGetCount");
    cuDeviceGet_t cuDeviceGet = (cuDeviceGet_t)need(lib, "cuDeviceGet");
    cuDeviceGetName_t cuDeviceGetName = (cuDeviceGetName_t)need(lib, "cuDeviceGetName");
    cuDeviceGetUuid_t cuDeviceGetUuid = (cuDeviceGetUuid_t)dlsym(lib, "cuDeviceGetUuid_v2");
    if (cuDeviceGetUuid == NULL) {
        cuDeviceGetUuid = (cuDeviceGetUuid_t)need(lib, "cuDeviceGetUuid");
    }
    cuDeviceTotalMem_t cuDeviceTotalMem = (cuDeviceTotalMem_t)need(lib, "cuDeviceTotalMem_v2");
    if (!cuInit || !cuDriverGetVersion || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName ||
        !cuDeviceGetUuid || !cuDeviceTotalMem) {
        return 2;
    }
    /* A workload reports only its own line: the harness parses the device lines of the check. */
    int version = 0;
    cuDriverGetVersion(&version);
    if (mode == NULL) {
        printf("cuda-driver: %d.%d\n", version / 1000, (version % 1000) / 10);
    }
    CUresult rc = cuInit(0);
    if (rc == CUDA_ERROR_NO_DEVICE) {
        printf("cuda-devices: 0\n");
        return mode == NULL ? 0 : 3;
    }
    if (rc != CUDA_SUCCESS) {
        printf("cuda-error: cuInit returned %d\ncuda-devices: 0\n", rc);
        return 3;
    }
    int count = 0;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS) {
        printf("cuda-error: cuDeviceGetCount failed\n");
        return 3;
    }
    if (mode == NULL) {
        printf("cuda-devices: %d\n", count);
    }
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        char name[256] = {0};
        CUuuid uuid;
        size_t memory = 0;
        memset(&uuid, 0, sizeof uuid);
        if (cuDeviceGet(&dev, i) != CUDA_SUCCESS || cuDeviceGetName(name, sizeof name, dev) ||
            cuDeviceGetUuid(&uuid, dev) || cuDeviceTotalMem(&memory, dev)) {
            printf("cuda-error: cannot read device %d\n", i);
            return 3;
        }
        if (mode == NULL) {
            printf("cuda-device %d: uuid=", i);
            print_uuid(&uuid);
            printf(" memory=%zu name=%s\n", memory, name);
        }
    }
    if (mode == NULL) {
        return 0;
    }
    if (count == 0) {
        printf("cuda-error: no device for %s\n", mode);
        return 3;
    }
    CUdevice first;
    cuDeviceGet(&first, 0);
    fflush(stdout);
    return workload(lib, first, mode, (size_t)strtoull(argv[2], NULL, 10));
}
