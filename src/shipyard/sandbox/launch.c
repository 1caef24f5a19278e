/* The one step between the agent and a job's process, compiled: shipyard.sandbox.launch
 * (launch.py) step for step, without an interpreter's start (issue 40: 20-30 ms of CPU
 * per job process for `python -I -S launch.py`, about 1 ms for this).
 *
 *   launch [--bind SRC DST]... -- PROGRAM ARGS...
 *
 * Environment (fixed by shipyard.sandbox.confine): PATH, SHIPYARD_PROCESS_NAME, the plan
 * SHIPYARD_LAUNCH ("key=hex;key=hex": mnt, cwd, seccomp) and the job's variables, each
 * as SHIPYARD_JOB_ENV:NAME=VALUE. In this order: join the instance's mount namespace and
 * change to the plan's cwd inside it; a mount namespace of its own per --bind set; drop
 * every capability and set no_new_privs; load the seccomp filter; exec PROGRAM with the
 * job's environment, searched in the job's PATH (as Python's os.execvpe does).
 * Exit status 125 when a step fails, 127 when the program is missing, 126 otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

static const char PLAN[] = "SHIPYARD_LAUNCH";
static const char ENV_PREFIX[] = "SHIPYARD_JOB_ENV:";
static const char PROCESS_NAME[] = "SHIPYARD_PROCESS_NAME";
extern char **environ;

static void fail(const char *what, int err) {
    fprintf(stderr, "shipyard: cannot start the job's process: %s%s%s\n", what,
            err ? ": " : "", err ? strerror(err) : "");
    _exit(125);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The plan's value for key (its bytes, NUL-terminated; *len without the NUL), or NULL. */
static unsigned char *plan_value(const char *plan, const char *key, size_t *len) {
    size_t klen = strlen(key);
    const char *item = plan;
    while (item && *item) {
        const char *end = strchr(item, ';');
        size_t ilen = end ? (size_t)(end - item) : strlen(item);
        if (ilen > klen && strncmp(item, key, klen) == 0 && item[klen] == '=') {
            const char *hex = item + klen + 1;
            size_t hlen = ilen - klen - 1;
            if (hlen % 2) fail("a malformed plan (an odd hex value)", 0);
            unsigned char *out = malloc(hlen / 2 + 1);
            if (!out) fail("out of memory", ENOMEM);
            for (size_t i = 0; i < hlen / 2; i++) {
                int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
                if (hi < 0 || lo < 0) fail("a malformed plan (not hex)", 0);
                out[i] = (unsigned char)(hi * 16 + lo);
            }
            out[hlen / 2] = 0;
            *len = hlen / 2;
            return out;
        }
        item = end ? end + 1 : NULL;
    }
    return NULL;
}

static void makedirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0777);
        *p = '/';
    }
    mkdir(buf, 0777);
}

static void enter(const char *mount_ns, const char *cwd, char **binds, int nbinds) {
    char what[4200];
    if (mount_ns) {
        int fd = open(mount_ns, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(what, sizeof what, "cannot open %s", mount_ns);
            fail(what, errno);
        }
        if (setns(fd, CLONE_NEWNS) != 0) {
            snprintf(what, sizeof what, "setns %s", mount_ns);
            fail(what, errno);
        }
        close(fd);
    }
    if (nbinds) {
        if (unshare(CLONE_NEWNS) != 0) fail("unshare(CLONE_NEWNS)", errno);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
            fail("mount --make-rprivate /", errno);
        for (int i = 0; i < nbinds; i++) {
            const char *source = binds[2 * i], *target = binds[2 * i + 1];
            makedirs(source); /* a peer's tree may not be built yet */
            makedirs(target);
            if (mount(source, target, NULL, MS_BIND, NULL) != 0) {
                snprintf(what, sizeof what, "mount --bind %s %s", source, target);
                fail(what, errno);
            }
        }
    }
    if (chdir(cwd) != 0) {
        snprintf(what, sizeof what, "cannot change directory to %s", cwd);
        fail(what, errno);
    }
}

static unsigned long long permitted(void) {
    FILE *fh = fopen("/proc/self/status", "re");
    char line[256];
    unsigned long long caps = 0;
    if (!fh) return 0;
    while (fgets(line, sizeof line, fh))
        if (strncmp(line, "CapPrm:", 7) == 0) caps = strtoull(line + 7, NULL, 16);
    fclose(fh);
    return caps;
}

/* No capability now, none at any later exec, no_new_privs (launch.py's drop_privileges). */
static void drop_privileges(void) {
    int last = 63;
    FILE *fh = fopen("/proc/sys/kernel/cap_last_cap", "re");
    if (fh) {
        if (fscanf(fh, "%d", &last) != 1) last = 63;
        fclose(fh);
    }
    /* a user other than root holding no capability has none to drop: EPERM is no failure */
    int powerless = getuid() != 0 && permitted() == 0;
    for (int cap = 0; cap <= last; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
            if (errno == EINVAL || (powerless && errno == EPERM)) continue;
            char what[64];
            snprintf(what, sizeof what, "prctl(PR_CAPBSET_DROP, %d)", cap);
            fail(what, errno);
        }
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); /* EINVAL before 4.3 */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("prctl(PR_SET_NO_NEW_PRIVS)", errno);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0) fail("capset (drop all)", errno);
}

/* The job's variables as they were before they were carried here, and the process name. */
static char **job_environment(void) {
    size_t n = 0, plen = strlen(ENV_PREFIX), nlen = strlen(PROCESS_NAME);
    for (char **e = environ; *e; e++) n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env) fail("out of memory", ENOMEM);
    const char *name = NULL;
    size_t k = 0;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, PROCESS_NAME, nlen) == 0 && (*e)[nlen] == '=') name = *e;
    }
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, ENV_PREFIX, plen) != 0) continue;
        const char *var = *e + plen;
        if (name && strncmp(var, PROCESS_NAME, nlen) == 0 && var[nlen] == '=') continue;
        env[k++] = (char *)var;
    }
    if (name) env[k++] = (char *)name;
    env[k] = NULL;
    return env;
}

/* execvpe with the search in the job's PATH (Python's os.execvpe); returns the errno. */
static int exec_job(char **argv, char **env) {
    if (strchr(argv[0], '/')) {
        execve(argv[0], argv, env);
        return errno;
    }
    const char *path = "/bin:/usr/bin"; /* os.defpath, as os.get_exec_path gives */
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    int saved = 0, last = ENOENT;
    const char *dir = path;
    char file[4096];
    for (;;) {
        const char *end = strchr(dir, ':');
        size_t dlen = end ? (size_t)(end - dir) : strlen(dir);
        if (dlen == 0)
            snprintf(file, sizeof file, "%s", argv[0]);
        else
            snprintf(file, sizeof file, "%.*s/%s", (int)dlen, dir, argv[0]);
        execve(file, argv, env);
        last = errno;
        if (last != ENOENT && last != ENOTDIR && !saved) saved = last;
        if (!end) break;
        dir = end + 1;
    }
    return saved ? saved : last;
}

int main(int argc, char **argv) {
    /* [--bind SRC DST]... -- PROGRAM ARGS...: the pairs are (argv[i+1], argv[i+2]) */
    int i = 1, nbinds = 0;
    while (i + 3 <= argc && strcmp(argv[i], "--bind") == 0) {
        i += 3;
        nbinds++;
    }
    if (i >= argc || strcmp(argv[i], "--") != 0 || i + 1 >= argc)
        fail("usage: launch.py [--bind SRC DST]... -- PROGRAM [ARGS...]", 0);
    char **program = argv + i + 1;
    char **pairs = calloc((size_t)nbinds * 2 + 1, sizeof *pairs);
    if (!pairs) fail("out of memory", ENOMEM);
    for (int b = 0; b < nbinds; b++) {
        pairs[2 * b] = argv[1 + 3 * b + 1];
        pairs[2 * b + 1] = argv[1 + 3 * b + 2];
    }
    /* no plan: started by hand or outside the agent; the environment is its own */
    const char *plan = getenv(PLAN);
    char **env = plan ? job_environment() : environ;
    size_t len = 0;
    unsigned char *mnt = plan ? plan_value(plan, "mnt", &len) : NULL;
    unsigned char *cwd = plan ? plan_value(plan, "cwd", &len) : NULL;
    enter(mnt && *mnt ? (char *)mnt : NULL, cwd && *cwd ? (char *)cwd : "/", pairs, nbinds);
    drop_privileges();
    size_t bpf_len = 0;
    unsigned char *bpf = plan ? plan_value(plan, "seccomp", &bpf_len) : NULL;
    if (bpf && bpf_len) { /* checked by the agent; said if the kernel still refuses */
        struct sock_fprog prog = {(unsigned short)(bpf_len / 8), (struct sock_filter *)bpf};
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
            fprintf(stderr, "shipyard: no seccomp filter for %s: prctl(PR_SET_SECCOMP): %s\n",
                    program[0], strerror(errno));
    }
    int err = exec_job(program, env);
    fprintf(stderr, "shipyard: cannot run %s: %s\n", program[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}
