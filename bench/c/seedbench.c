/* seedbench: the seed workloads as an unmodified program makes them, with libc calls only,
 * so that one binary can be run on a kernel tmpfs, on a lanefs mount through the kernel,
 * and on the same mount under `lanefs run` (docs/BENCHMARKS.md, "Unmodified programs").
 *
 *   seedbench WORKLOAD DIR WORKERS SECONDS [threads|procs]
 *
 * WORKLOAD: crunl (create+close+unlink of the worker's own names in DIR, one shared
 * directory), rndrename (create a random name, rename it to another random name, unlink it,
 * in DIR), stat (each worker makes its own tree DIR/tW/dJ/fK, 10 x 100 files, then stats them
 * round and round), orc (open+read 40 bytes+close over 100 shared files), fsmark (create,
 * fsync and close empty files in the worker's own directory).
 * Workers are threads or processes (fork). Prints one line:
 *   WORKLOAD WORKERS MODE OPS_PER_SECOND
 * where one op is one iteration of the workload's loop. Set-up is not timed; workers start
 * together after it and stop when SECONDS have passed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 256
#define TREE_DIRS 10
#define TREE_FILES 100
#define ORC_FILES 100

struct shared {
    atomic_int ready;
    atomic_int go;
    atomic_int stop;
    struct { uint64_t ops; char pad[56]; } count[MAX_WORKERS];
};

static struct shared *sh;
static const char *workload, *dir;

static void die(const char *what, const char *path) {
    fprintf(stderr, "seedbench: %s %s: %s\n", what, path, strerror(errno));
    exit(2);
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static void setup(int w) {
    char p[4096];
    if (!strcmp(workload, "stat")) {
        snprintf(p, sizeof p, "%s/t%d", dir, w);
        if (mkdir(p, 0755) && errno != EEXIST) die("mkdir", p);
        for (int d = 0; d < TREE_DIRS; d++) {
            snprintf(p, sizeof p, "%s/t%d/d%d", dir, w, d);
            if (mkdir(p, 0755) && errno != EEXIST) die("mkdir", p);
            for (int f = 0; f < TREE_FILES; f++) {
                snprintf(p, sizeof p, "%s/t%d/d%d/f%d", dir, w, d, f);
                int fd = open(p, O_CREAT | O_WRONLY, 0644);
                if (fd < 0) die("create", p);
                close(fd);
            }
        }
    } else if (!strcmp(workload, "fsmark")) {
        snprintf(p, sizeof p, "%s/m%d", dir, w);
        if (mkdir(p, 0755) && errno != EEXIST) die("mkdir", p);
    }
}

static void work(int w) {
    char p[4096], q[4096], buf[64];
    uint64_t n = 0, seed = 0x9E3779B97F4A7C15ull ^ (uint64_t)(w + 1) * 7919;
    setup(w);
    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load(&sh->go)) ;
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        if (!strcmp(workload, "crunl")) {
            snprintf(p, sizeof p, "%s/c%d-%llu", dir, w, (unsigned long long)(n % 64));
            int fd = open(p, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) die("create", p);
            close(fd);
            if (unlink(p)) die("unlink", p);
        } else if (!strcmp(workload, "rndrename")) {
            snprintf(p, sizeof p, "%s/r%d-%llx", dir, w, (unsigned long long)rnd(&seed));
            snprintf(q, sizeof q, "%s/r%d-%llx", dir, w, (unsigned long long)rnd(&seed));
            int fd = open(p, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) die("create", p);
            close(fd);
            if (rename(p, q)) die("rename", p);
            if (unlink(q)) die("unlink", q);
        } else if (!strcmp(workload, "stat")) {
            struct stat st;
            snprintf(p, sizeof p, "%s/t%d/d%llu/f%llu", dir, w,
                     (unsigned long long)(n / TREE_FILES % TREE_DIRS),
                     (unsigned long long)(n % TREE_FILES));
            if (stat(p, &st)) die("stat", p);
        } else if (!strcmp(workload, "orc")) {
            snprintf(p, sizeof p, "%s/o%llu", dir, (unsigned long long)(rnd(&seed) % ORC_FILES));
            int fd = open(p, O_RDONLY);
            if (fd < 0) die("open", p);
            if (read(fd, buf, 40) != 40) die("read", p);
            close(fd);
        } else if (!strcmp(workload, "fsmark")) {
            snprintf(p, sizeof p, "%s/m%d/f%d-%llu", dir, w, (int)getpid(), (unsigned long long)n);
            int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0644);
            if (fd < 0) die("create", p);
            if (fsync(fd)) die("fsync", p);
            close(fd);
        } else {
            fprintf(stderr, "seedbench: unknown workload %s\n", workload);
            exit(2);
        }
        n++;
        sh->count[w].ops = n;
    }
}

static void *thread_main(void *arg) {
    work((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: seedbench crunl|rndrename|stat|orc|fsmark DIR WORKERS SECONDS [threads|procs]\n");
        return 2;
    }
    workload = argv[1];
    dir = argv[2];
    int workers = atoi(argv[3]);
    double secs = atof(argv[4]);
    int procs = argc > 5 && !strcmp(argv[5], "procs");
    if (workers < 1 || workers > MAX_WORKERS) return 2;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) die("mmap", "");
    if (!strcmp(workload, "orc")) {
        char p[4096], data[40];
        memset(data, 'x', sizeof data);
        for (int i = 0; i < ORC_FILES; i++) {
            snprintf(p, sizeof p, "%s/o%d", dir, i);
            int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
            if (fd < 0 || write(fd, data, 40) != 40) die("create", p);
            close(fd);
        }
    }
    pthread_t t[MAX_WORKERS];
    pid_t pid[MAX_WORKERS];
    for (int w = 0; w < workers; w++) {
        if (procs) {
            pid[w] = fork();
            if (pid[w] == 0) { work(w); _exit(0); }
        } else {
            pthread_create(&t[w], NULL, thread_main, (void *)(intptr_t)w);
        }
    }
    while (atomic_load(&sh->ready) < workers) usleep(1000);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    atomic_store(&sh->go, 1);
    usleep((useconds_t)(secs * 1e6));
    atomic_store(&sh->stop, 1);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t total = 0;
    for (int w = 0; w < workers; w++) total += sh->count[w].ops;
    for (int w = 0; w < workers; w++) {
        if (procs) waitpid(pid[w], NULL, 0); else pthread_join(t[w], NULL);
    }
    double el = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%s %d %s %.0f\n", workload, workers, procs ? "procs" : "threads", total / el);
    return 0;
}
