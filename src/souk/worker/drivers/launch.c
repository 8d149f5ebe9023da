/* souk-launch: how the process driver starts what a machine runs.
 *
 *   souk-launch --serve FD
 *   souk-launch [--netns FD] [--resolv FD] [--join FD]... [--ids UID:GID] [--no-new-privs]
 *               [--environ] -- COMMAND [ARG ...]
 *   souk-launch [--netns FD] --exit-to FILE -- COMMAND [ARG ...]
 *   souk-launch --processes
 *   souk-launch --protocol
 *
 * --serve FD  starts machines for the worker at the other end of FD, a SOCK_SEQPACKET socket, one
 *             request a message (below), until the worker closes it: a machine's start costs a
 *             fork of this small process, not an exec of one more program from the worker.
 * --resolv FD  in a mount namespace of its own, mounts the file FD over /etc/resolv.conf (what
 *             `ip netns exec` does): the machine asks its worker's DNS.
 * --join FD   writes "0" (itself) to FD, a `cgroup.procs` the worker opened, and closes it: the
 *             command runs in the machine's cgroups from its first instruction.
 * --ids U:G   drops to user U and group G with no supplementary groups (a root worker).
 * --no-new-privs  no exec from then on gains privileges: setuid and setgid bits and file
 *             capabilities are ignored, so the command cannot climb back through one of the
 *             host's setuid programs (a container's runtime spec asks runc the same).
 * --environ   the command's environment is not this one's: it is SOUK_ENV0, SOUK_ENV1, ... up to
 *             SOUK_ENVS of them, each a NAME=value. A root launcher's own environment never holds
 *             a variable a machine chose (LD_*, GLIBC_TUNABLES, ...) under its own name: the
 *             machine's variables take effect at the command's exec, once the ids are dropped.
 * --netns FD  first of all, joins the network namespace FD (a root worker's machine's own,
 *             docs/network.md) before the rest: a command runs in it, and so does runc, so
 *             that neither it nor `runc exec` has to join it themselves.
 * --processes the supervisor of a machine's several processes (Fly's `processes`): starts each
 *             as described in its environment (`supervise` below), each as its own ids when it
 *             runs as root, and exits when the first of them exits, with its status, once the
 *             others are gone (SIGTERM, SIGKILL after GRACE seconds). It stays in the machine's
 *             process group and passes no signal on: the group gets them all. It never runs a
 *             machine's code, and, static, no loader reads its environment.
 * --exit-to FILE  runs COMMAND as a child, waits for it, and writes its exit code (128 plus the
 *             signal that ended it, as a shell says) to FILE.tmp, renamed to FILE: the runc
 *             driver's record of a container's exit, which outlives the worker.
 *
 * --protocol prints the version of this interface that this build speaks (`PROTOCOL` in
 * launcher.py): a worker finding an older build does not use it.
 *
 * A request (`_request` in spawner.py, in the host's byte order): five 32-bit words, flags (IDS,
 * NO_NEW_PRIVS, NETNS, RESOLV), uid, gid, argc and envc; then the path to run, the working
 * directory, the argv and the environment, each string ending in a NUL; and as SCM_RIGHTS, the
 * command's stdin, stdout and stderr, the namespace (NETNS) and resolv.conf (RESOLV), then the
 * cgroup.procs to join. Its child is made a child of the worker
 * (CLONE_PARENT): the worker reaps it and reads its exit. The answer, once the command runs or
 * has failed to: three 32-bit words, the child's pid, an errno (0: it runs) and the step that
 * failed (STEP_*). A failed child exits 127 at once; the worker reaps it too.
 *
 * Python forks the whole worker when it is asked to change ids or run code before the exec, and
 * util-linux's setpriv, which dropped the ids before, spent a millisecond loading its libraries
 * and locale: this is one static binary making a few system calls. On the command line, any
 * failure ends it before COMMAND runs: 125 for its own, 126 or 127 for a command it cannot run,
 * as a shell says. Built by scripts/setup.sh (see docs/worker.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROTOCOL 6 /* launcher.py's PROTOCOL: raised with every change to this interface */
#define LAST_ID 4294967294UL /* (uid_t) -1 means "unchanged" to the kernel: never an id */
#define MAX_JOIN 8
#define MAX_PROCESSES 1024
#define MAX_STRINGS (1ul << 20)
#define GRACE 10 /* seconds the other processes get once the first has exited */
#define IDS 1u
#define NO_NEW_PRIVS 2u
#define NETNS 4u
#define RESOLV 8u

enum step { STEP_NONE, STEP_REQUEST, STEP_CLONE, STEP_CHDIR, STEP_JOIN, STEP_IDS,
            STEP_NO_NEW_PRIVS, STEP_EXEC, STEP_NETNS };

struct confinement {
    const int *join;
    int joins;
    int netns, resolv; /* -1: none */
    unsigned flags;
    unsigned long uid, gid;
};

/* Joins the groups, drops the ids, sets no-new-privs: 0, or the step that failed (errno set). */
static enum step confine(const struct confinement *c) {
    char link[32], source[4096];
    ssize_t n = 0;
    if (c->netns >= 0 && setns(c->netns, CLONE_NEWNET) != 0)
        return STEP_NETNS;
    /* by its path: a file open in the mount namespace left behind cannot be bound in another */
    snprintf(link, sizeof link, "/proc/self/fd/%d", c->resolv);
    if (c->resolv >= 0 && (n = readlink(link, source, sizeof source - 1)) < 0)
        return STEP_NETNS;
    source[n] = '\0';
    if (c->resolv >= 0 && (unshare(CLONE_NEWNS) != 0 ||
                           mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
                           mount(source, "/etc/resolv.conf", NULL, MS_BIND, NULL) != 0))
        return STEP_NETNS;
    if (c->netns >= 0)
        close(c->netns); /* none of them reaches the command */
    if (c->resolv >= 0)
        close(c->resolv);
    for (int j = 0; j < c->joins; j++) {
        if (write(c->join[j], "0", 1) != 1)
            return STEP_JOIN;
        close(c->join[j]);
    }
    if ((c->flags & IDS) && (setgroups(0, NULL) != 0 || setresgid(c->gid, c->gid, c->gid) != 0 ||
                             setresuid(c->uid, c->uid, c->uid) != 0))
        return STEP_IDS;
    if ((c->flags & NO_NEW_PRIVS) && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return STEP_NO_NEW_PRIVS;
    return STEP_NONE;
}

/* --serve */

struct request {
    uint32_t flags, uid, gid, argc, envc;
};

struct answer {
    int32_t pid, error, step;
};

/* The `count` NUL-ended strings from `*at` up to `end`, into `out` (NULL after them), or -1. */
static int strings(char **at, const char *end, uint32_t count, char **out) {
    for (uint32_t k = 0; k < count; k++) {
        char *nul = memchr(*at, '\0', end - *at);
        if (!nul)
            return -1;
        out[k] = *at;
        *at = nul + 1;
    }
    out[count] = NULL;
    return 0;
}

/* In the child: its own session, stdio and directory, confined, then the command; on any
 * failure, the step and errno written to `report` (close-on-exec: nothing written means it ran). */
static void become(int sock, int report, const int *fds, const struct confinement *c,
                   const char *cwd, const char *path, char **argv, char **env) {
    sigset_t none;
    enum step step = STEP_NONE;
    close(sock); /* at once: a child stuck before its exec must not keep the server's socket open */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], i) < 0)
            step = STEP_REQUEST;
    if (step == STEP_NONE && chdir(cwd) != 0) /* as the worker, as `subprocess` does */
        step = STEP_CHDIR;
    if (step == STEP_NONE)
        step = confine(c);
    if (step == STEP_NONE) {
        execve(path, argv, env);
        step = STEP_EXEC;
    }
    int said[2] = {step, errno};
    (void)!write(report, said, sizeof said);
    _exit(127);
}

static struct answer start(int sock, char *message, size_t size, const int *fds, int nfds) {
    struct answer answer = {0, EINVAL, STEP_REQUEST};
    struct request head;
    char *at = message + sizeof head, *cwd[2], *path[2], **argv = NULL, **env = NULL;
    int report[2];
    if (size < sizeof head || nfds < 3 || nfds > 5 + MAX_JOIN)
        return answer;
    memcpy(&head, message, sizeof head);
    if (head.argc < 1 || head.argc > size || head.envc > size)
        return answer;
    argv = calloc(head.argc + 1, sizeof *argv);
    env = calloc(head.envc + 1, sizeof *env);
    if (!argv || !env || strings(&at, message + size, 1, path) ||
        strings(&at, message + size, 1, cwd) || strings(&at, message + size, head.argc, argv) ||
        strings(&at, message + size, head.envc, env) || at != message + size)
        goto done;
    int extra = !!(head.flags & NETNS) + !!(head.flags & RESOLV);
    if (nfds < 3 + extra)
        goto done;
    struct confinement c = {fds + 3 + extra, nfds - 3 - extra, -1, -1, head.flags, head.uid,
                            head.gid};
    if (head.flags & NETNS)
        c.netns = fds[3];
    if (head.flags & RESOLV)
        c.resolv = fds[3 + !!(head.flags & NETNS)];
    if (pipe2(report, O_CLOEXEC) != 0) {
        answer = (struct answer){0, errno, STEP_CLONE};
        goto done;
    }
    /* A child of the worker, not of this server: the worker reaps it and reads its exit. */
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        become(sock, report[1], fds, &c, cwd[0], path[0], argv, env);
    close(report[1]);
    int said[2] = {STEP_NONE, 0};
    ssize_t got;
    while ((got = read(report[0], said, sizeof said)) < 0 && errno == EINTR)
        ;
    close(report[0]);
    if (pid < 0)
        answer = (struct answer){0, errno, STEP_CLONE};
    else if (got == (ssize_t)sizeof said)
        answer = (struct answer){pid, said[1], said[0]};
    else
        answer = (struct answer){pid, 0, STEP_NONE};
done:
    free(argv);
    free(env);
    return answer;
}

static int serve(int sock) {
    if (fcntl(sock, F_SETFD, FD_CLOEXEC) != 0)
        return 125;
    for (;;) {
        ssize_t size = recv(sock, NULL, 0, MSG_PEEK | MSG_TRUNC);
        if (size == 0)
            return 0; /* the worker is gone */
        if (size < 0) {
            if (errno == EINTR)
                continue;
            return 125;
        }
        char *message = malloc((size_t)size);
        union {
            char space[CMSG_SPACE(sizeof(int) * (5 + MAX_JOIN))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {message, (size_t)size};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                             .msg_controllen = sizeof control.space};
        if (!message)
            return 125;
        ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (got <= 0) {
            free(message);
            if (got < 0 && errno == EINTR)
                continue;
            return got == 0 ? 0 : 125;
        }
        int fds[5 + MAX_JOIN], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int k = 0; k < n && nfds < 5 + MAX_JOIN; k++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        }
        struct answer answer = {0, EINVAL, STEP_REQUEST};
        if (!(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
            answer = start(sock, message, (size_t)got, fds, nfds);
        for (int k = 0; k < nfds; k++)
            close(fds[k]);
        free(message);
        if (send(sock, &answer, sizeof answer, MSG_NOSIGNAL) != (ssize_t)sizeof answer)
            return 0;
    }
}

/* The command line */

static int usage(const char *why) {
    fprintf(stderr, "souk-launch: %s\n", why);
    fprintf(stderr, "usage: souk-launch --serve FD\n"
                    "       souk-launch [--netns FD] [--resolv FD] [--join FD]... [--ids UID:GID]"
                    " [--no-new-privs] [--environ] -- COMMAND\n"
                    "       souk-launch [--netns FD] --exit-to FILE -- COMMAND\n"
                    "       souk-launch --processes\n");
    return 125;
}

/* A decimal number up to `max`, ending at `stop`: its end, or NULL. */
static const char *number(const char *text, unsigned long max, char stop, unsigned long *out) {
    char *end;
    if (text[0] < '0' || text[0] > '9')
        return NULL;
    errno = 0;
    *out = strtoul(text, &end, 10);
    return (errno || *end != stop || *out > max) ? NULL : end;
}

static int descriptor(const char *text) {
    unsigned long fd;
    return (number(text, 1 << 20, '\0', &fd) && fd > 2) ? (int)fd : -1;
}

/* --environ and --processes: numbered variables of this program's own environment */

extern char **environ;

/* The value of the variable `name` in `env`, or NULL. */
static char *value_of(char **env, const char *name) {
    size_t n = strlen(name);
    for (char **e = env; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* The values of `prefix`0 .. `prefix`<count - 1> in `env`, in order, into `out` (NULL after
 * them): 0, or -1 if one is missing. */
static int numbered(char **env, const char *prefix, unsigned long count, char **out) {
    size_t n = strlen(prefix);
    unsigned long k, found = 0;
    for (k = 0; k <= count; k++)
        out[k] = NULL;
    for (char **e = env; *e; e++) {
        const char *end;
        if (strncmp(*e, prefix, n) != 0 || !(end = number(*e + n, count, '=', &k)) || k >= count)
            continue;
        if (!out[k])
            found++;
        out[k] = (char *)end + 1;
    }
    return found == count ? 0 : -1;
}

/* A NULL-ended array of the `count` variables `prefix`0..., or NULL (errno set). */
static char **strings_of(char **env, const char *prefix, unsigned long count) {
    char **out = calloc(count + 1, sizeof *out);
    if (out && numbered(env, prefix, count, out) != 0) {
        free(out);
        errno = EINVAL;
        return NULL;
    }
    return out;
}

/* --processes */

struct process {
    char **argv, **env;
    int ids;
    unsigned long uid, gid;
    pid_t pid;
};

static volatile sig_atomic_t late;

static void nothing(int sig) { (void)sig; }

static void too_late(int sig) {
    (void)sig;
    late = 1;
}

/* The processes SOUK_PROCESSES says, each from SOUK_PROCESS<i>, "ARGC:ENVC" or
 * "ARGC:ENVC:UID:GID", with its argv in SOUK_PROCESS<i>_ARG<k> and its environment in
 * SOUK_PROCESS<i>_ENV<k>. */
static struct process *described(char **env, unsigned long *count) {
    const char *text = value_of(env, "SOUK_PROCESSES");
    if (!text || !number(text, MAX_PROCESSES, '\0', count) || *count < 1)
        return NULL;
    struct process *procs = calloc(*count, sizeof *procs);
    for (unsigned long i = 0; procs && i < *count; i++) {
        char name[64];
        unsigned long argc, envc;
        const char *at;
        snprintf(name, sizeof name, "SOUK_PROCESS%lu", i);
        if (!(text = value_of(env, name)) || !(at = number(text, MAX_STRINGS, ':', &argc)) ||
            argc < 1)
            return NULL;
        const char *ends = number(at + 1, MAX_STRINGS, '\0', &envc);
        if (!ends && !(at = number(at + 1, MAX_STRINGS, ':', &envc)))
            return NULL;
        if (!ends) { /* ids follow */
            const char *gid = number(at + 1, LAST_ID, ':', &procs[i].uid);
            if (!gid || !number(gid + 1, LAST_ID, '\0', &procs[i].gid))
                return NULL;
            procs[i].ids = 1;
        }
        snprintf(name, sizeof name, "SOUK_PROCESS%lu_ARG", i);
        procs[i].argv = strings_of(env, name, argc);
        snprintf(name, sizeof name, "SOUK_PROCESS%lu_ENV", i);
        procs[i].env = strings_of(env, name, envc);
        if (!procs[i].argv || !procs[i].env)
            return NULL;
    }
    return procs;
}

/* 128 plus the signal that ended it, as a shell says. */
static int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The one of `procs` that `pid` is, or -1. */
static long which(const struct process *procs, unsigned long count, pid_t pid) {
    for (unsigned long i = 0; i < count; i++)
        if (procs[i].pid == pid)
            return (long)i;
    return -1;
}

static int supervise(void) {
    unsigned long count, left = 0;
    struct process *procs = described(environ, &count);
    struct sigaction quiet = {.sa_handler = nothing}, alarm_ = {.sa_handler = too_late};
    int first = 127, status;
    if (!procs)
        return usage("--processes: SOUK_PROCESSES and its variables are missing or malformed");
    for (int sig = 1; sig < NSIG; sig++) /* the group's processes get it; this one waits */
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT)
            sigaction(sig, &quiet, NULL);
    sigaction(SIGALRM, &alarm_, NULL); /* no SA_RESTART: it interrupts the wait below */
    for (unsigned long i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "souk: cannot start a process: %s\n", strerror(errno));
            break;
        }
        if (pid == 0) {
            const struct process *p = &procs[i];
            if (p->ids && (setgroups(0, NULL) != 0 || setresgid(p->gid, p->gid, p->gid) != 0 ||
                           setresuid(p->uid, p->uid, p->uid) != 0)) {
                fprintf(stderr, "souk: cannot drop to %lu:%lu: %s\n", p->uid, p->gid,
                        strerror(errno));
                _exit(127);
            }
            environ = p->env; /* execvp looks in the process's own PATH */
            execvp(p->argv[0], p->argv);
            fprintf(stderr, "%s: %s\n", p->argv[0], strerror(errno));
            _exit(errno == ENOENT ? 127 : 126);
        }
        procs[i].pid = pid;
        left++;
    }
    if (left == count) { /* all started: the first to exit says how the machine ends */
        for (;;) {
            pid_t pid = waitpid(-1, &status, 0);
            long i = pid > 0 ? which(procs, count, pid) : -1;
            if (pid < 0 && errno != EINTR)
                break;
            if (i >= 0) {
                first = status_code(status);
                procs[i].pid = 0;
                left--;
                break;
            }
        }
    }
    for (unsigned long i = 0; i < count; i++)
        if (procs[i].pid > 0)
            kill(procs[i].pid, SIGTERM);
    alarm(GRACE);
    while (left > 0) {
        pid_t pid = waitpid(-1, NULL, 0);
        long i = pid > 0 ? which(procs, count, pid) : -1;
        if (i >= 0) {
            procs[i].pid = 0;
            left--;
        } else if (pid < 0 && errno == ECHILD) {
            break;
        } else if (late) {
            late = 0;
            for (unsigned long k = 0; k < count; k++)
                if (procs[k].pid > 0)
                    kill(procs[k].pid, SIGKILL);
        }
    }
    return first;
}

/* --exit-to */

static int failed(const char *what, int code) {
    fprintf(stderr, "souk-launch: %s: %s\n", what, strerror(errno));
    return code;
}

static int record_exit(const char *file, char **argv) {
    char tmp[4096];
    int status, code;
    pid_t pid = fork();
    if (pid < 0)
        return failed("fork", 125);
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "%s: %s\n", argv[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return failed("waiting for the command", 125);
    code = status_code(status);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", file) >= (int)sizeof tmp)
        return usage("--exit-to: the file's name is too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *out = fd < 0 ? NULL : fdopen(fd, "w");
    if (!out || fprintf(out, "%d\n", code) < 0 || fclose(out) != 0 || rename(tmp, file) != 0)
        return failed("recording the exit code", 125);
    return code;
}

int main(int argc, char **argv) {
    static const char *steps[] = {[STEP_JOIN] = "joining the machine's cgroup",
                                  [STEP_IDS] = "dropping to the app's ids",
                                  [STEP_NO_NEW_PRIVS] = "--no-new-privs",
                                  [STEP_NETNS] = "entering the machine's network"};
    int join[MAX_JOIN], i, sock;
    struct confinement c = {join, 0, -1, -1, 0, 0, 0};
    char **env = NULL;
    const char *rest;
    if (argc == 2 && strcmp(argv[1], "--protocol") == 0) {
        printf("%d\n", PROTOCOL);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--processes") == 0)
        return supervise();
    if (argc >= 3 && strcmp(argv[1], "--netns") == 0) {
        if ((sock = descriptor(argv[2])) < 0)
            return usage("--netns needs a descriptor above 2");
        if (setns(sock, CLONE_NEWNET) != 0)
            return failed("joining the machine's network namespace", 125);
        close(sock);
        argc -= 2;
        argv += 2;
    }
    if (argc >= 5 && strcmp(argv[1], "--exit-to") == 0 && strcmp(argv[3], "--") == 0)
        return record_exit(argv[2], argv + 4);
    if (argc == 3 && strcmp(argv[1], "--serve") == 0) {
        if ((sock = descriptor(argv[2])) < 0)
            return usage("--serve needs a descriptor above 2");
        return serve(sock);
    }
    for (i = 1; i + 1 < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (strcmp(argv[i], "--no-new-privs") == 0) {
            c.flags |= NO_NEW_PRIVS;
            i--; /* a flag without a value */
        } else if (strcmp(argv[i], "--resolv") == 0) {
            if ((c.resolv = descriptor(argv[i + 1])) < 0)
                return usage("--resolv needs a descriptor above 2");
        } else if (strcmp(argv[i], "--environ") == 0) {
            env = environ;
            i--;
        } else if (strcmp(argv[i], "--join") == 0 && c.joins < MAX_JOIN) {
            if ((join[c.joins++] = descriptor(argv[i + 1])) < 0)
                return usage("--join needs a descriptor above 2");
        } else if (strcmp(argv[i], "--ids") == 0) {
            rest = number(argv[i + 1], LAST_ID, ':', &c.uid);
            if (!rest || !number(rest + 1, LAST_ID, '\0', &c.gid))
                return usage("--ids needs UID:GID");
            c.flags |= IDS;
        } else {
            return usage("unknown option");
        }
    }
    if (i + 1 >= argc || strcmp(argv[i], "--") != 0)
        return usage("no command after --");
    if (env) { /* read before anything runs: the command gets these and nothing else */
        const char *text = value_of(env, "SOUK_ENVS");
        unsigned long count;
        if (!text || !number(text, MAX_STRINGS, '\0', &count) ||
            !(env = strings_of(env, "SOUK_ENV", count)))
            return usage("--environ: SOUK_ENVS and its variables are missing or malformed");
    }
    enum step step = confine(&c);
    if (step != STEP_NONE)
        return failed(steps[step], 125);
    if (env)
        environ = env; /* execvp looks in the command's own PATH */
    execvp(argv[i + 1], argv + i + 1);
    int code = errno == ENOENT ? 127 : 126; /* said as a shell says it */
    fprintf(stderr, "%s: %s\n", argv[i + 1], strerror(errno));
    return code;
}
