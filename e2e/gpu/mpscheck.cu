// An MPS client for e2e/gpu/mps_demo.py: reports the SM count CUDA gives this process and
// the number of distinct SMs a kernel of many blocks actually ran on (read from %smid).
// Under an MPS active-thread limit both shrink; without MPS both are the whole GPU.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <unistd.h>

__global__ void spin(unsigned *smids, long long cycles) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) smids[blockIdx.x] = id;
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

int main(int argc, char **argv) {
    long long cycles = argc > 1 ? atoll(argv[1]) : 200000000LL;
    const int blocks = 4096;
    int sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (err != cudaSuccess) {
        printf("pid=%d error=%s\n", getpid(), cudaGetErrorString(err));
        return 1;
    }
    unsigned *d = nullptr;
    cudaMalloc(&d, blocks * sizeof(unsigned));
    spin<<<blocks, 64>>>(d, cycles);
    err = cudaDeviceSynchronize();
    unsigned h[blocks];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    std::set<unsigned> used(h, h + blocks);
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    printf("pid=%d sms_reported=%d sms_used_by_kernel=%zu kernel=%s pipe=%s\n", getpid(), sms,
           used.size(), cudaGetErrorString(err), pipe ? pipe : "(unset)");
    return err == cudaSuccess ? 0 : 1;
}
