/* The machine's config, a 'C' frame of keys and values: a guest's from the channel, a
 * container's from stdin (without root, volumes, network or files). */
#include "init.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* "no", "always", or "on-failure" with ":N", at most N restarts (none: no limit). */
static void restart_policy(struct proc *p, const char *val) {
    p->restart = strcmp(val, "always") == 0 ? 1 : strncmp(val, "on-failure", 10) == 0 ? 2 : 0;
    const char *colon = strchr(val, ':');
    p->max_retries = colon ? atoi(colon + 1) : -1;
}

int configure(struct field *f, int n, const char **addr, const char **gw) {
    struct proc *p = NULL;
    char *file_path = NULL;
    mode_t file_mode = 0644;
    int rooted = 0;
    for (int i = 0; i + 1 < n; i += 2) {
        struct field k = f[i], v = f[i + 1];
        char *val = dup_field(v);
        if (is(k, "hostname")) {
            sethostname(val, strlen(val));
        } else if (is(k, "addr")) {
            *addr = val;
        } else if (is(k, "gw")) {
            *gw = val;
        } else if (is(k, "root")) {
            mkdir(NEWROOT, 0755);
            if (wait_for(val, 100) != 0 || mount(val, NEWROOT, "ext4", 0, NULL) != 0) {
                sayerr("cannot mount the root disk", val);
                return -1;
            }
            mount_under("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
            mount_under("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
            mount_under("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, NULL);
            mount_under("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "ptmxmode=0666");
            mount_under("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
            mount_under("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755");
            rooted = 1;
        } else if (is(k, "volume")) { /* "SERIAL PATH" */
            if (mount_volume(val) != 0)
                return -1;
        } else if (net_option(k, val)) {
        } else if (is(k, "env")) {
            push(&menv, val);
        } else if (is(k, "exec_ids")) {
            sscanf(val, "%u:%u", &exec_uid, &exec_gid);
        } else if (is(k, "exec_cwd")) {
            snprintf(exec_cwd, sizeof exec_cwd, "%s", val);
        } else if (is(k, "file_path")) {
            file_path = val;
        } else if (is(k, "file_mode")) {
            file_mode = (mode_t)strtoul(val, NULL, 8) & 07777;
        } else if (is(k, "file_data")) {
            if (!file_path || write_file(file_path, file_mode, v) != 0) {
                sayerr("cannot write", file_path ? file_path : "a file");
                return -1;
            }
        } else if (is(k, "proc") && nprocs < MAX_PROCS) { /* its restart: no|always|on-failure:N */
            p = &procs[nprocs++];
            restart_policy(p, val);
            snprintf(p->cwd, sizeof p->cwd, "/");
        } else if (p && is(k, "arg")) {
            push(&p->argv, val);
        } else if (p && is(k, "penv")) {
            push(&p->env, val);
        } else if (p && is(k, "ids")) {
            sscanf(val, "%u:%u", &p->uid, &p->gid);
        } else if (p && is(k, "cwd")) {
            snprintf(p->cwd, sizeof p->cwd, "%s", val);
        }
    }
    if (!rooted)
        return 0;
    if (chdir(NEWROOT) != 0 || mount(".", "/", NULL, MS_MOVE, NULL) != 0 || chroot(".") != 0 ||
        chdir("/") != 0) {
        say("cannot move into the root disk");
        return -1;
    }
    return 0;
}
