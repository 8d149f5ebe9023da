/* souk-launch: how the process driver starts what a machine runs.
 *
 *   souk-launch [--join FD]... [--ready FD] [--ids UID:GID] [--no-new-privs] -- COMMAND [ARG ...]
 *   souk-launch --protocol
 *
 * --join FD   writes "0" (itself) to FD, a `cgroup.procs` the worker opened, and closes it: the
 *             command runs in the machine's cgroups from its first instruction.
 * --ready FD  marks FD close-on-exec: whoever holds the other end of that pipe sees it close the
 *             moment COMMAND runs (or the launcher fails), with no polling.
 * --ids U:G   drops to user U and group G with no supplementary groups (a root worker).
 * --no-new-privs  no exec from then on gains privileges: setuid and setgid bits and file
 *             capabilities are ignored, so the command cannot climb back through one of the
 *             host's setuid programs (a container's runtime spec asks runc the same).
 *
 * --protocol prints the version of these flags that this build speaks (`PROTOCOL` in
 * launcher.py): a worker finding an older build does not use it.
 *
 * Python forks the whole worker when it is asked to change ids or run code before the exec; with
 * this, it vforks. util-linux's setpriv, which dropped the ids before, spent a millisecond loading
 * its libraries and locale: this is one static binary making a few system calls. Any failure ends
 * it before COMMAND runs: 125 for its own, 126 or 127 for a command it cannot run, as a shell
 * says. Built by scripts/setup.sh (see docs/worker.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROTOCOL 2 /* launcher.py's PROTOCOL: raised with every change to the flags */
#define LAST_ID 4294967294UL /* (uid_t) -1 means "unchanged" to the kernel: never an id */
#define MAX_JOIN 8

static int usage(const char *why) {
    fprintf(stderr, "souk-launch: %s\n", why);
    fprintf(stderr, "usage: souk-launch [--join FD]... [--ready FD] [--ids UID:GID]"
                    " [--no-new-privs] -- COMMAND\n");
    return 125;
}

static int failed(const char *what, int code) {
    fprintf(stderr, "souk-launch: %s: %s\n", what, strerror(errno));
    return code;
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

int main(int argc, char **argv) {
    int join[MAX_JOIN], joins = 0, ready = -1, i;
    int ids = 0, no_new_privs = 0;
    unsigned long uid = 0, gid = 0;
    const char *rest;
    if (argc == 2 && strcmp(argv[1], "--protocol") == 0) {
        printf("%d\n", PROTOCOL);
        return 0;
    }
    for (i = 1; i + 1 < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (strcmp(argv[i], "--no-new-privs") == 0) {
            no_new_privs = 1;
            i--; /* a flag without a value */
        } else if (strcmp(argv[i], "--join") == 0 && joins < MAX_JOIN) {
            if ((join[joins++] = descriptor(argv[i + 1])) < 0)
                return usage("--join needs a descriptor above 2");
        } else if (strcmp(argv[i], "--ready") == 0) {
            if ((ready = descriptor(argv[i + 1])) < 0)
                return usage("--ready needs a descriptor above 2");
        } else if (strcmp(argv[i], "--ids") == 0) {
            rest = number(argv[i + 1], LAST_ID, ':', &uid);
            if (!rest || !number(rest + 1, LAST_ID, '\0', &gid))
                return usage("--ids needs UID:GID");
            ids = 1;
        } else {
            return usage("unknown option");
        }
    }
    if (i + 1 >= argc || strcmp(argv[i], "--") != 0)
        return usage("no command after --");
    for (int j = 0; j < joins; j++) {
        if (write(join[j], "0", 1) != 1)
            return failed("joining the machine's cgroup", 125);
        close(join[j]);
    }
    if (ids && (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 ||
                setresuid(uid, uid, uid) != 0))
        return failed("dropping to the app's ids", 125);
    if (no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return failed("--no-new-privs", 125);
    if (ready >= 0 && fcntl(ready, F_SETFD, FD_CLOEXEC) != 0)
        return failed("--ready", 125);
    execvp(argv[i + 1], argv + i + 1);
    int code = errno == ENOENT ? 127 : 126; /* said as a shell says it */
    fprintf(stderr, "%s: %s\n", argv[i + 1], strerror(errno));
    return code;
}
