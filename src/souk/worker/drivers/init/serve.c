/* What a guest's worker asks of it on the channel once its processes run: `exec` (a command of
 * its own, its output sent back whole), signals to an exec or to every process, a stop, `ps`.
 * A container's are the runc driver's (runc exec, the container's cgroup). */
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

struct exec execs[MAX_EXECS];
struct strs menv; /* an exec's environment: the machine's */
uid_t exec_uid;
gid_t exec_gid;
char exec_cwd[512] = "/";

/* -- exec ----------------------------------------------------------------------------------- */

static void start_exec(uint32_t id, struct field *f, int n) {
    struct exec *e = NULL;
    for (int i = 0; i < MAX_EXECS; i++)
        if (!execs[i].pid && execs[i].out < 0 && execs[i].err < 0) {
            e = &execs[i];
            break;
        }
    if (!e || n < 5) {
        send_text('O', id, "");
        return;
    }
    uid_t uid = (uid_t)strtoul(dup_field(f[0]), NULL, 10);
    gid_t gid = (gid_t)strtoul(dup_field(f[1]), NULL, 10);
    char *cwd = dup_field(f[2]);
    char *argv[256];
    int argc = 0;
    for (int i = 4; i < n && argc < 255; i++)
        argv[argc++] = dup_field(f[i]);
    argv[argc] = NULL;
    int in = memfd_create("stdin", MFD_CLOEXEC);
    write_all(in, f[3].data, f[3].len);
    lseek(in, 0, SEEK_SET);
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        child_setup(uid, gid, cwd);
        run(argv, menv.v, menv.n);
    }
    close(in);
    close(out[1]);
    close(err[1]);
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    free(cwd);
    *e = (struct exec){.id = id, .pid = pid, .out = out[0], .err = err[0]};
}

void exec_done_maybe(struct exec *e) {
    if (!e->exited || e->out >= 0 || e->err >= 0)
        return;
    char code[16], sig[16];
    snprintf(code, sizeof code, "%d", status_code(e->status));
    snprintf(sig, sizeof sig, "%d", WIFSIGNALED(e->status) ? WTERMSIG(e->status) : 0);
    struct field f[4] = {{code, (uint32_t)strlen(code)},
                         {sig, (uint32_t)strlen(sig)},
                         {e->bout.data ? e->bout.data : "", (uint32_t)e->bout.len},
                         {e->berr.data ? e->berr.data : "", (uint32_t)e->berr.len}};
    send_frame('O', e->id, 4, f);
    free(e->bout.data);
    free(e->berr.data);
    *e = (struct exec){.out = -1, .err = -1};
}

void drain(struct exec *e, int *fd, struct buf *b) {
    char chunk[65536];
    ssize_t n = read(*fd, chunk, sizeof chunk);
    if (n > 0) {
        if (b->len + (size_t)n <= MAX_OUTPUT) {
            b->data = realloc(b->data, b->len + (size_t)n);
            memcpy(b->data + b->len, chunk, (size_t)n);
            b->len += (size_t)n;
        }
        return;
    }
    if (n < 0 && errno == EINTR)
        return;
    close(*fd);
    *fd = -1;
    exec_done_maybe(e);
}

/* -- requests ------------------------------------------------------------------------------- */

static void ps(uint32_t id) {
    static struct field f[MAX_PS];
    static char lines[MAX_PS][300];
    int n = 0;
    DIR *dir = opendir("/proc");
    struct dirent *d;
    while (dir && (d = readdir(dir)) && n < MAX_PS) {
        if (d->d_name[0] < '0' || d->d_name[0] > '9')
            continue;
        char path[300], comm[32] = {0}, arg;
        snprintf(path, sizeof path, "/proc/%s/cmdline", d->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t has = read(fd, &arg, 1); /* none: a kernel thread, not the machine's */
        close(fd);
        if (has != 1)
            continue;
        snprintf(path, sizeof path, "/proc/%s/comm", d->d_name);
        fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, comm, sizeof comm - 1);
        close(fd);
        if (len <= 0)
            continue;
        comm[strcspn(comm, "\n")] = 0;
        snprintf(lines[n], sizeof lines[n], "%.32s %s", d->d_name, comm);
        f[n].data = lines[n];
        f[n].len = (uint32_t)strlen(lines[n]);
        n++;
    }
    if (dir)
        closedir(dir);
    send_frame('p', id, n, f);
}

void request(char type, uint32_t id, struct field *f, int n) {
    if (type == 'E') {
        start_exec(id, f, n);
    } else if (type == 'K' && n >= 1) {
        int sig = atoi(dup_field(f[0]));
        for (int i = 0; i < MAX_EXECS; i++)
            if (execs[i].id == id && execs[i].pid > 0)
                kill(-execs[i].pid, sig);
    } else if (type == 'S' && n >= 1) {
        signal_all(atoi(dup_field(f[0])));
    } else if (type == 'T' && n >= 1) {
        stop_all(atoi(dup_field(f[0])));
    } else if (type == 'P') {
        ps(id);
    }
}
