// How long a parked thread takes to run after a condition-variable wake, by how long it was
// idle, and whether two busy threads slow each other (arithmetic, and random reads over
// 4 and 24 MB: separate cores with their own caches take about their alone time): what the
// batch fill's second thread meets (bench/README.md, batch_bench). A diagnostic, not a
// benchmark of formline.
//
//   gcc -O2 -pthread bench/diagnostics/wake_latency.c -o /tmp/wake_latency && /tmp/wake_latency
//
// Run it alone: a second busy process changes both figures.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kWakes = 200 };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int pending = 0;
static double sent_at;
static double latencies[kWakes];
static atomic_int woken = 0;

static void* parked(void* unused) {
  (void)unused;
  for (int k = 0; k < kWakes; ++k) {
    pthread_mutex_lock(&lock);
    while (!pending) pthread_cond_wait(&wake, &lock);
    pending = 0;
    pthread_mutex_unlock(&lock);
    latencies[k] = now_us() - sent_at;
    atomic_store(&woken, k + 1);
  }
  return NULL;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// The waker busy-waits `idle_us` (the parked thread's CPU idles), then wakes it.
static void measure_wakes(double idle_us) {
  pthread_t thread;
  atomic_store(&woken, 0);
  pthread_create(&thread, NULL, parked, NULL);
  for (int k = 0; k < kWakes; ++k) {
    const double begin = now_us();
    while (now_us() - begin < idle_us) {
    }
    pthread_mutex_lock(&lock);
    sent_at = now_us();
    pending = 1;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
    while (atomic_load(&woken) <= k) {
    }
  }
  pthread_join(thread, NULL);
  qsort(latencies, kWakes, sizeof latencies[0], compare);
  printf("wake after %6.0f us idle: p10 %5.1f  p50 %5.1f  p90 %5.1f us\n", idle_us,
         latencies[kWakes / 10], latencies[kWakes / 2], latencies[kWakes * 9 / 10]);
}

static volatile uint64_t sink;

static void* arithmetic(void* unused) {
  (void)unused;
  uint64_t a = 1, b = 2, c = 3, d = 4;
  for (long i = 0; i < 300000000; ++i) {
    a = a * 3 + i;
    b = b * 5 + i;
    c ^= c << 1;
    d += d >> 3;
  }
  sink = a + b + c + d;
  return NULL;
}

// One random cycle through `count` slots: each read's address is the last read's value.
static uint32_t* make_cycle(size_t count) {
  uint32_t* order = malloc(count * sizeof *order);
  uint32_t* next = malloc(count * sizeof *next);
  for (size_t k = 0; k < count; ++k) order[k] = (uint32_t)k;
  for (size_t k = count - 1; k > 0; --k) {
    const size_t other = (size_t)rand() % (k + 1);
    const uint32_t kept = order[k];
    order[k] = order[other];
    order[other] = kept;
  }
  for (size_t k = 0; k < count; ++k) next[order[k]] = order[(k + 1) % count];
  free(order);
  return next;
}

static void* chase(void* cycle) {
  const uint32_t* next = cycle;
  uint32_t at = 0;
  for (long k = 0; k < 20000000; ++k) at = next[at];
  sink = at;
  return NULL;
}

// `work(mine)` alone, then beside `work(theirs)` on another thread.
static void compare_pair(const char* name, void* (*work)(void*), void* mine, void* theirs) {
  double begin = now_us();
  work(mine);
  const double alone = now_us() - begin;
  pthread_t thread;
  begin = now_us();
  pthread_create(&thread, NULL, work, theirs);
  work(mine);
  pthread_join(thread, NULL);
  const double beside = now_us() - begin;
  printf("%-22s alone %4.0f ms, beside a copy %4.0f ms (%.2fx the time)\n", name, alone / 1e3,
         beside / 1e3, beside / alone);
}

int main(void) {
  measure_wakes(200);
  measure_wakes(2000);
  measure_wakes(20000);
  compare_pair("arithmetic", arithmetic, NULL, NULL);
  const size_t megabytes[] = {4, 24};
  for (int k = 0; k < 2; ++k) {
    const size_t count = (megabytes[k] << 20) / sizeof(uint32_t);
    uint32_t* mine = make_cycle(count);
    uint32_t* theirs = make_cycle(count);
    char name[32];
    snprintf(name, sizeof name, "random reads, %zu MB", megabytes[k]);
    compare_pair(name, chase, mine, theirs);
    free(mine);
    free(theirs);
  }
  return 0;
}
