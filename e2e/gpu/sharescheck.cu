// A client for e2e/gpu/shares_demo.py: allocates device memory in steps until cudaMalloc
// fails, reports how much it got and the error that stopped it, then holds the memory until
// the file named by its second argument exists (so two clients hold their shares at once).
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <vector>

int main(int argc, char **argv) {
    const size_t step = (size_t)(argc > 1 ? atoll(argv[1]) : 256) << 20;  // MiB per step
    const char *release = argc > 2 ? argv[2] : nullptr;
    std::vector<void *> held;
    size_t total = 0;
    cudaError_t err = cudaSuccess;
    for (;;) {
        void *p = nullptr;
        err = cudaMalloc(&p, step);
        if (err != cudaSuccess) break;
        held.push_back(p);
        total += step;
    }
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const char *limit = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    printf("pid=%d allocated_mib=%zu stopped_by=%s mem_total_mib=%zu env_limit=%s\n", getpid(),
           total >> 20, cudaGetErrorName(err), total_b >> 20, limit ? limit : "(unset)");
    fflush(stdout);
    while (release && access(release, F_OK) != 0) usleep(100000);
    for (void *p : held) cudaFree(p);
    return err == cudaErrorMemoryAllocation ? 0 : 1;
}
