/* The processes PID 1 runs, in a guest and in a container alike: each started in a session of
 * its own as its ids, reaped (orphans too), restarted by its own policy, stopped; and the loop
 * PID 1 ends in, which also answers a guest's channel. */
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct proc procs[MAX_PROCS];
int nprocs;
int in_container;
static int ending, exit_code = -1;
static int stopping; /* the machine was told to stop: no process is restarted */
static time_t kill_at, chan_away_until;

/* -- processes ------------------------------------------------------------------------------ */

/* In a container whose processes run as several ids souk-init holds the capabilities it needs
 * to give each its own (CAP_SETUID, CAP_SETGID, and CAP_SETPCAP for this): taken out of the
 * bounding set before the exec, so a process running as the container's root gets no more than
 * the container's list. Where all run as souk-init does, it holds none of them. */
static void drop_init_caps(void) {
    if (!in_container)
        return;
    const int caps[] = {CAP_SETUID, CAP_SETGID, CAP_SETPCAP}; /* CAP_SETPCAP last: it allows it */
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
        if (prctl(PR_CAPBSET_READ, caps[i], 0, 0, 0) == 1 &&
            prctl(PR_CAPBSET_DROP, caps[i], 0, 0, 0) != 0) {
            dprintf(2, "souk-init: cannot drop capability %d: %s\n", caps[i], strerror(errno));
            _exit(126);
        }
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void child_setup(uid_t uid, gid_t gid, const char *cwd) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    drop_init_caps();
    /* as souk-init runs: nothing to change (nor, in a container, the right to) */
    int same = getuid() == uid && geteuid() == uid && getgid() == gid && getegid() == gid;
    if (!same && (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)) {
        dprintf(2, "souk-init: cannot become %u:%u: %s\n", uid, gid, strerror(errno));
        _exit(126);
    }
    if (chdir(cwd) != 0)
        chdir("/");
}

static char *find_env(char **env, int n, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < n; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    return NULL;
}

/* execvpe with the PATH of the process's own environment. */
void run(char **argv, char **env, int envc) {
    environ = env;
    char *path = find_env(env, envc, "PATH");
    if (path)
        setenv("PATH", path, 1);
    execvpe(argv[0], argv, env);
    dprintf(2, "souk-init: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
}

static int start(struct proc *p) {
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(hvc_out, 1);
        dup2(hvc_err, 2);
        child_setup(p->uid, p->gid, p->cwd);
        run(p->argv.v, p->env.v, p->env.n);
    }
    p->pid = pid;
    p->started_ms = now_ms();
    return 0;
}

int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void signal_all(int sig) {
    for (int i = 0; i < nprocs; i++)
        if (procs[i].pid > 0)
            kill(-procs[i].pid, sig);
}

static void end_with(int code) {
    if (ending)
        return;
    ending = 1;
    exit_code = code;
    kill_at = time(NULL) + GRACE;
    signal_all(SIGTERM);
}

/* The machine is told to stop (its stop signal, which reaches every process): nothing is
 * restarted from now on, and a process waiting for its restart is done. */
void stop_all(int sig) {
    stopping = 1;
    signal_all(sig);
    for (int i = 0; i < nprocs; i++)
        if (procs[i].restart_at_ms) {
            procs[i].restart_at_ms = 0;
            procs[i].done = 1;
            end_with(procs[i].last_code);
        }
}

/* Restarted by its own policy (always; on-failure: a code other than 0, at most max_retries
 * times), after a pause that doubles from 100 ms to 5 s while it keeps failing within 10 s of
 * its start; otherwise done, which ends the machine with its code. */
static void process_exited(struct proc *p, int status) {
    int code = status_code(status);
    long long now = now_ms();
    p->pid = 0;
    p->last_code = code;
    if (!ending && !stopping && (p->restart == 1 || (p->restart == 2 && code != 0)) &&
        (p->restart == 1 || p->max_retries < 0 || p->retries < p->max_retries)) {
        p->retries++;
        p->quick = now - p->started_ms >= 10000 ? 0 : p->quick + 1;
        int wait = p->quick ? 100 << (p->quick > 6 ? 6 : p->quick - 1) : 0;
        p->restart_at_ms = now + (wait > 5000 ? 5000 : wait) + 1;
        dprintf(hvc_err, "souk-init: %s exited with %d: restarting it\n", p->argv.v[0], code);
        return;
    }
    p->done = 1;
    end_with(code);
}

/* A signal a machine can be told to stop with (the API's list, but SIGKILL): runc passes on
 * every signal it gets, its runtime's own (SIGURG, which preempts goroutines) included. */
static int stop_signal(int sig) {
    switch (sig) {
    case SIGHUP: case SIGINT: case SIGQUIT: case SIGILL: case SIGTRAP: case SIGABRT: case SIGFPE:
    case SIGUSR1: case SIGSEGV: case SIGUSR2: case SIGPIPE: case SIGALRM: case SIGTERM:
        return 1;
    default:
        return 0;
    }
}

/* Starts the processes whose restart is due, unless the machine ends; how long until the next
 * one is (-1: none). */
static int restart_due(void) {
    long long now = now_ms(), next = -1;
    for (int i = 0; i < nprocs; i++) {
        struct proc *p = &procs[i];
        if (!p->restart_at_ms)
            continue;
        if (ending || stopping) { /* the machine ends: this one is done too */
            p->restart_at_ms = 0;
            p->done = 1;
            continue;
        }
        if (p->restart_at_ms > now) {
            long long in = p->restart_at_ms - now;
            next = next < 0 || in < next ? in : next;
            continue;
        }
        p->restart_at_ms = 0;
        if (start(p) != 0) {
            p->done = 1;
            end_with(125);
        }
    }
    return (int)next;
}

/* The end of the machine: a container's PID 1 exits with its code (the kernel kills what is
 * left in its namespace), a guest powers off. */
static void finish(int code) {
    if (in_container)
        exit(code);
    power_off(code);
}

void start_all(void) {
    for (int i = 0; i < nprocs; i++) {
        if (start(&procs[i]) != 0) {
            send_text('F', 0, "fork failed");
            finish(125);
        }
    }
    if (nprocs == 0)
        end_with(0);
}

/* Reaps, restarts, forwards signals, answers the channel (a guest's), until the end. */
void supervise(int sigfd) {
    char type;
    uint32_t id;
    static struct field fields[MAX_FIELDS];
    int n;
    char *storage;
    for (;;) {
        struct pollfd fds[2 + 2 * MAX_EXECS];
        int nfds = 0;
        fds[nfds++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        /* With no worker at the host's end the port reads as hung up: asked again later. */
        int away = time(NULL) < chan_away_until;
        fds[nfds++] = (struct pollfd){.fd = away ? -1 : chan, .events = POLLIN};
        for (int i = 0; i < MAX_EXECS; i++) {
            fds[nfds++] = (struct pollfd){.fd = execs[i].out, .events = POLLIN};
            fds[nfds++] = (struct pollfd){.fd = execs[i].err, .events = POLLIN};
        }
        int due = restart_due(), wait = ending || away ? 200 : -1;
        wait = due >= 0 && (wait < 0 || due < wait) ? due : wait;
        if (poll(fds, (nfds_t)nfds, wait) < 0 && errno != EINTR)
            finish(125);
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sigfd, &si, sizeof si) == sizeof si && stop_signal((int)si.ssi_signo))
                stop_all((int)si.ssi_signo); /* PID 1 is told to stop: every process is */
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                for (int i = 0; i < nprocs; i++)
                    if (procs[i].pid == pid)
                        process_exited(&procs[i], status);
                for (int i = 0; i < MAX_EXECS; i++)
                    if (execs[i].pid == pid) {
                        execs[i].exited = 1;
                        execs[i].status = status;
                        execs[i].pid = 0;
                        exec_done_maybe(&execs[i]);
                    }
            }
        }
        if (fds[1].revents & POLLIN) {
            if (read_frame(&type, &id, fields, &n, &storage) == 0) {
                request(type, id, fields, n);
                free(storage);
            } else {
                chan_away_until = time(NULL) + 1;
            }
        } else if (fds[1].revents) {
            chan_away_until = time(NULL) + 1;
        }
        for (int i = 0; i < MAX_EXECS; i++) {
            if (fds[2 + 2 * i].revents)
                drain(&execs[i], &execs[i].out, &execs[i].bout);
            if (fds[3 + 2 * i].revents)
                drain(&execs[i], &execs[i].err, &execs[i].berr);
        }
        if (ending) {
            int left = 0;
            for (int i = 0; i < nprocs; i++)
                left += procs[i].pid > 0;
            if (!left)
                finish(exit_code);
            if (time(NULL) >= kill_at)
                signal_all(SIGKILL);
        }
    }
}
