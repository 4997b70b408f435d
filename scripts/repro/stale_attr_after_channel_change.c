// Known bug (client/src/warm.rs; docs/BENCHMARKS.md, `lanefs run --warm-stat`): a change made
// over the channel is, about once in 2,000 to 10,000 tries, missing from the same thread's
// next stat through the kernel, for up to about 40 us, while other threads stat the file
// through the kernel. Seen with both transports (io_uring, and `-o uring=off`). A single
// thread under `lanefs run --warm-stat` does utimensat(F, mtime=k) (over the channel) and then
// stat(F) (F is warm: through the kernel); three threads of a forked child stat F through the
// kernel (raw syscalls) and other spellings of F over the channel.
//     cc -O2 -pthread -o /tmp/repro scripts/repro/stale_attr_after_channel_change.c
//     lanefs run --warm-stat -- /tmp/repro MOUNTDIR [N]     # exit status 1: stale stats seen
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
static char F[512], MNT[256], REL[512];
static void *bg(void *a) {
  unsigned long k = (unsigned long)a << 22; char c[4096]; struct stat st;
  for (;;) {
    syscall(SYS_newfstatat, AT_FDCWD, F, &st, 0);        // kernel GETATTR traffic
    char *p = c + sprintf(c, "%s/", MNT);                 // a never-seen spelling: channel
    for (int i = 0; i < 24; i++) p += sprintf(p, ((k >> i) & 1) ? ".//" : "./");
    sprintf(p, "%s", REL); stat(c, &st); k++;
  }
}
int main(int argc, char **argv) {
  setvbuf(stdout, 0, _IONBF, 0);
  long N = argc > 2 ? atol(argv[2]) : 5000;
  snprintf(MNT, sizeof MNT, "%s", argv[1]);
  snprintf(REL, sizeof REL, "repro%d/F", getpid());
  char d[512]; snprintf(d, sizeof d, "%s/repro%d", MNT, getpid()); mkdir(d, 0755);
  snprintf(F, sizeof F, "%s/F", d);
  close(open(F, O_CREAT | O_WRONLY, 0644));
  struct stat st; close(open(F, O_RDONLY));                // the kernel looks F up
  for (int i = 0; i < 3; i++) stat(F, &st);                // F is now warm in this process
  pid_t kid = fork();
  if (!kid) { pthread_t t; for (long i = 1; i <= 3; i++) pthread_create(&t, 0, bg, (void *)i); pause(); }
  usleep(100000);
  long bad = 0;
  for (long k = 1; k <= N; k++) {
    struct timespec ts[2] = {{k, 0}, {k, 0}};
    if (utimensat(AT_FDCWD, F, ts, 0)) { perror("utimensat"); break; }
    if (stat(F, &st)) { perror("stat"); break; }
    if (st.st_mtim.tv_sec != k) {
      struct stat st2; stat(F, &st2);
      if (bad++ < 10) printf("STALE: utimensat(F, mtime=%ld) returned 0, then stat(F) gave mtime=%ld (an immediate second stat: %ld)\n", k, (long)st.st_mtim.tv_sec, (long)st2.st_mtim.tv_sec);
    }
    usleep(300);
  }
  kill(kid, SIGKILL); waitpid(kid, 0, 0);
  printf("%ld of %ld stats after a returned utimensat were stale\n", bad, N);
  return bad != 0;
}
