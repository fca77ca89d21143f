/* What CUDA in a container sees: the driver API's device count, and each device's name, UUID and
 * memory, printed one line each for the harness to parse.
 *
 * libcuda is opened with dlopen rather than linked, so the binary builds with the plain gcc of any
 * machine (no CUDA toolkit) and runs in a container that has no driver at all: a pod without a GPU
 * claim gets no libcuda from CDI, and then honestly reports zero devices. Output:
 *   cuda-driver: <version>|none (<why>)
 *   cuda-devices: <n>
 *   cuda-device <i>: uuid=GPU-... memory=<bytes> name=<name>
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

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

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("cuda-driver: none (%s)\ncuda-devices: 0\n", dlerror());
        return 0;
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
    int version = 0;
    cuDriverGetVersion(&version);
    printf("cuda-driver: %d.%d\n", version / 1000, (version % 1000) / 10);
    CUresult rc = cuInit(0);
    if (rc == CUDA_ERROR_NO_DEVICE) {
        printf("cuda-devices: 0\n");
        return 0;
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
    printf("cuda-devices: %d\n", count);
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
        printf("cuda-device %d: uuid=", i);
        print_uuid(&uuid);
        printf(" memory=%zu name=%s\n", memory, name);
    }
    return 0;
}
