/* Extra receive cost of a message that lands in a fresh memory mapping, per 4 KiB page.
 *
 * glibc's malloc serves a request above its mmap threshold (at most 32 MiB on 64-bit) with a
 * new mapping, returned on free, so a receiver that allocates each large message anew (as
 * libzmq does for ps-lite) takes a page fault, and the kernel zeroes the page, for every
 * 4 KiB it receives. This times a 128 MiB copy into a fresh mapping (mmap, memcpy, munmap)
 * against the same copy into memory already mapped, and prints the difference per page:
 * a figure for the simulator's page_fault_us on this host.
 *
 *   gcc -O2 -o page_fault_cost tools/probes/page_fault_cost.c && ./page_fault_cost
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const size_t n = (size_t)128 << 20;
    const int reps = 20;
    char *mapped = malloc(n), *src = malloc(n);
    if (!mapped || !src) return 1;
    memset(mapped, 1, n);
    memset(src, 2, n);
    double fresh = 0, warm = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 1;
        memcpy(p, src, n);
        munmap(p, n);
        double t1 = now();
        memcpy(mapped, src, n);
        double t2 = now();
        fresh += t1 - t0;
        warm += t2 - t1;
    }
    double pages = (double)n / 4096 * reps;
    printf("fresh mapping %.2f GB/s, mapped memory %.2f GB/s: %.2f us more per 4 KiB page\n",
           n * reps / fresh / 1e9, n * reps / warm / 1e9, (fresh - warm) / pages * 1e6);
    free(mapped);
    free(src);
    return 0;
}
