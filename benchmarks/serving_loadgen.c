/* A keep-alive HTTP/1.1 load generator for benchmarks/serving.py (wrk-style, no deps).
 *
 * Why C: on a 2-core machine the load generator shares the cores with the server it
 * measures; the asyncio client costs ~24 us of CPU per request, this one a few, so the
 * server keeps the CPU a real deployment (clients elsewhere) would give it. Same pattern
 * as the Python client: `concurrency` connections, one request in flight on each
 * (no pipelining), the same pre-built request bytes, each response framed by its
 * Content-Length. Latency per request is kept for p50/p99.
 *
 * usage: serving_loadgen HOST PORT CONCURRENCY SECONDS WARMUP_SECONDS REQUEST_FILE
 * prints one JSON line: {"requests": n, "seconds": s, "p50_ms": .., "p99_ms": .., "non200": k,
 *                        "errors": e, "client_cpu_s": c}
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXCONN 1024
#define BUFSZ (1 << 20)
#define MAXLAT (1 << 24)

typedef struct {
  int fd;
  size_t sent, used;
  double start;
  char *buf;
} conn_t;

static char *req;
static size_t req_len;
static double *lat;
static long nlat, nreq, non200, nerr;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int dial(const char *host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host, &a.sin_addr);
  if (connect(fd, (void *)&a, sizeof a) < 0) {
    perror("connect");
    exit(2);
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

static void send_req(conn_t *c) {
  c->start = now();
  c->sent = 0;
  while (c->sent < req_len) {
    ssize_t w = write(c->fd, req + c->sent, req_len - c->sent);
    if (w < 0) {
      if (errno == EAGAIN) continue; /* requests are small: the buffer drains at once */
      nerr++;
      return;
    }
    c->sent += w;
  }
}

/* 1 when a whole response is in the buffer (consumed), 0 when more bytes are needed */
static int take_response(conn_t *c, int record) {
  c->buf[c->used] = 0;
  char *end = strstr(c->buf, "\r\n\r\n");
  if (!end) return 0;
  char *cl = strcasestr(c->buf, "content-length:");
  long body = (cl && cl < end) ? atol(cl + 15) : 0;
  size_t total = (end + 4 - c->buf) + body;
  if (c->used < total) return 0;
  if (strncmp(c->buf, "HTTP/1.1 200", 12) != 0) non200++;
  if (record) {
    if (nlat < MAXLAT) lat[nlat++] = now() - c->start;
    nreq++;
  }
  memmove(c->buf, c->buf + total, c->used - total);
  c->used -= total;
  return 1;
}

static void run(const char *host, int port, int n, double seconds, int record, conn_t *conns) {
  int ep = epoll_create1(0);
  for (int i = 0; i < n; i++) {
    conns[i].fd = dial(host, port);
    conns[i].used = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
    send_req(&conns[i]);
  }
  double stop = now() + seconds;
  int open = n;
  struct epoll_event evs[MAXCONN];
  while (open > 0) {
    int k = epoll_wait(ep, evs, MAXCONN, 1000);
    for (int j = 0; j < k; j++) {
      conn_t *c = &conns[evs[j].data.u32];
      if (c->fd < 0) continue;
      ssize_t r = read(c->fd, c->buf + c->used, BUFSZ - 1 - c->used);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN) continue;
        nerr++;
        close(c->fd);
        c->fd = -1;
        open--;
        continue;
      }
      c->used += r;
      if (!take_response(c, record)) continue;
      if (now() >= stop) {
        close(c->fd);
        c->fd = -1;
        open--;
      } else {
        send_req(c);
      }
    }
  }
  close(ep);
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: %s HOST PORT CONCURRENCY SECONDS WARMUP_SECONDS REQUEST_FILE\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[3]);
  if (n < 1 || n > MAXCONN) {
    fprintf(stderr, "concurrency must be 1..%d\n", MAXCONN);
    return 2;
  }
  FILE *f = fopen(argv[6], "rb");
  if (!f) {
    perror(argv[6]);
    return 2;
  }
  fseek(f, 0, SEEK_END);
  req_len = ftell(f);
  fseek(f, 0, SEEK_SET);
  req = malloc(req_len);
  if (fread(req, 1, req_len, f) != req_len) return 2;
  fclose(f);
  lat = malloc(sizeof(double) * MAXLAT);
  conn_t *conns = calloc(n, sizeof(conn_t));
  for (int i = 0; i < n; i++) conns[i].buf = malloc(BUFSZ);
  run(argv[1], atoi(argv[2]), n, atof(argv[5]), 0, conns);
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = now();
  run(argv[1], atoi(argv[2]), n, atof(argv[4]), 1, conns);
  double elapsed = now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  double cpu = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) * 1e-6 +
               (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
  qsort(lat, nlat, sizeof(double), cmp);
  double p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(long)(nlat * 0.99)] : 0;
  printf("{\"requests\": %ld, \"seconds\": %.6f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
         "\"non200\": %ld, \"errors\": %ld, \"client_cpu_s\": %.6f}\n",
         nreq, elapsed, p50 * 1e3, p99 * 1e3, non200, nerr, cpu);
  return 0;
}
