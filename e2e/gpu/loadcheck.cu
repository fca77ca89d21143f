// A "pod's" GPU process for e2e/gpu/telemetry_demo.py: holds MIB of device memory for SECONDS,
// and with "busy" keeps the SMs working the whole time (with "idle" it only sleeps).
//   loadcheck busy|idle SECONDS MIB
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: loadcheck busy|idle SECONDS MIB\n");
        return 2;
    }
    bool busy = strcmp(argv[1], "busy") == 0;
    double seconds = atof(argv[2]);
    size_t mib = strtoull(argv[3], nullptr, 10);
    void *d = nullptr;
    cudaError_t err = cudaMalloc(&d, mib << 20);
    printf("pid=%d mode=%s malloc=%s\n", getpid(), argv[1], cudaGetErrorString(err));
    fflush(stdout);
    if (err != cudaSuccess) return 1;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (busy) {
            spin<<<64, 64>>>(50000000LL);
            cudaDeviceSynchronize();
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    }
    return 0;
}
