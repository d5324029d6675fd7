/* Sender CPU per ps-lite-shaped message over ZeroMQ and kernel TCP (loopback).
 *
 * A message is the four frames ps-lite's ZMQVan sends for a push: meta, keys, vals (the
 * slice, zero-copy) and lens. The sender's process CPU (its thread and libzmq's I/O thread)
 * per message, against the slice size, gives ZeroMQ's fixed per-message share (size 0)
 * beside its per-byte cost. It measures libzmq only, not ps-lite's own work per message
 * (protobuf meta, locks, queues): a lower bound for the tcp transport's per-message cost.
 *
 * Build against the libzmq that pyzmq's wheel ships (no headers needed):
 *   python -m venv /tmp/zq && /tmp/zq/bin/pip install pyzmq
 *   LIB=$(find /tmp/zq -name 'libzmq-*.so.*' | head -1)
 *   gcc -O2 -o zmq_message_cost tools/probes/zmq_message_cost.c "$LIB" -Wl,-rpath,$(dirname "$LIB")
 * Run (one receiver and one sender per size; columns: bytes, messages, process CPU us,
 * sender-thread CPU us, wall us, each per message):
 *   for s in 0 4096 65536 200000 1048576; do
 *     ./zmq_message_cost recv $s 20000 & sleep 0.1; ./zmq_message_cost send $s 20000; wait
 *   done
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
typedef struct { unsigned char _[64]; } zmq_msg_t;
typedef void (zmq_free_fn)(void *data, void *hint);
void *zmq_ctx_new(void); void *zmq_socket(void *, int); int zmq_connect(void *, const char *);
int zmq_bind(void *, const char *); int zmq_send(void *, const void *, size_t, int);
int zmq_recv(void *, void *, size_t, int); int zmq_msg_init_data(zmq_msg_t *, void *, size_t, zmq_free_fn *, void *);
int zmq_msg_send(zmq_msg_t *, void *, int); int zmq_msg_init(zmq_msg_t *); int zmq_msg_recv(zmq_msg_t *, void *, int);
int zmq_msg_close(zmq_msg_t *); int zmq_msg_more(const zmq_msg_t *); int zmq_close(void *); int zmq_ctx_term(void *);
int zmq_setsockopt(void *, int, const void *, size_t);
#define ZMQ_DEALER 5
#define ZMQ_ROUTER 6
#define ZMQ_SNDMORE 2
#define ZMQ_SNDHWM 23
#define ZMQ_RCVHWM 24
static double cpu(void) { struct rusage r; getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6; }
static double thr_cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double wall(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void nofree(void *d, void *h) { (void)d; (void)h; }
int main(int argc, char **argv) {
  int recv_side = strcmp(argv[1], "recv") == 0; size_t size = atol(argv[2]); long n = atol(argv[3]);
  void *ctx = zmq_ctx_new(); int hwm = 0;
  if (recv_side) {
    void *s = zmq_socket(ctx, ZMQ_ROUTER); zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_bind(s, "tcp://127.0.0.1:5599");
    for (long i = 0; i < n + n / 10; i++) {
      int more = 1;
      while (more) { zmq_msg_t m; zmq_msg_init(&m); zmq_msg_recv(&m, s, 0); more = zmq_msg_more(&m); zmq_msg_close(&m); }
    }
    zmq_close(s); zmq_ctx_term(ctx); return 0;
  }
  void *s = zmq_socket(ctx, ZMQ_DEALER); zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_connect(s, "tcp://127.0.0.1:5599"); usleep(200000);
  char meta[96]; memset(meta, 1, sizeof meta); unsigned long long key = 7; int len = (int)(size / 4);
  char *vals = malloc(size ? size : 1); memset(vals, 2, size ? size : 1);
  long warm = n / 10; double c0 = 0, t0 = 0, w0 = 0;
  for (long i = 0; i < n + warm; i++) {
    if (i == warm) { c0 = cpu(); t0 = thr_cpu(); w0 = wall(); }
    zmq_msg_t m;
    zmq_msg_init_data(&m, meta, sizeof meta, nofree, NULL); zmq_msg_send(&m, s, ZMQ_SNDMORE);
    zmq_msg_init_data(&m, &key, sizeof key, nofree, NULL); zmq_msg_send(&m, s, ZMQ_SNDMORE);
    zmq_msg_init_data(&m, vals, size, nofree, NULL); zmq_msg_send(&m, s, ZMQ_SNDMORE);
    zmq_msg_init_data(&m, &len, sizeof len, nofree, NULL); zmq_msg_send(&m, s, 0);
  }
  /* wait until the receiver has everything: it exits; we linger */
  int linger = -1; zmq_setsockopt(s, 17, &linger, sizeof linger);
  zmq_close(s); zmq_ctx_term(ctx);
  double c1 = cpu(), t1 = thr_cpu(), w1 = wall();
  printf("%zu %ld %.3f %.3f %.3f\n", size, n, (c1 - c0) / n * 1e6, (t1 - t0) / n * 1e6, (w1 - w0) / n * 1e6);
  return 0;
}
