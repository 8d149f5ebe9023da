/* souk-init: PID 1 of a souk microVM guest.
 *
 * The worker boots the guest with this program as the initramfs's /init, beside the kernel
 * modules the guest needs (listed in /modules/order, loaded in that order). It then:
 *   - mounts /dev, /proc, /sys and finds its channel to the worker: the virtio-serial port named
 *     `souk.0`, which only it holds open (a port takes one opener), and the consoles hvc0 and
 *     hvc1, where its processes' stdout and stderr go (the machine's log files on the host);
 *   - says hello and reads the machine's config from the channel, never from the kernel's
 *     command line (any process of the guest can read that): hostname, address, the root and
 *     volume disks, the environment, `files` (secrets included), and the processes to run;
 *   - mounts the root disk, the volumes, writes the files, moves into the new root, sets up
 *     the network, starts every process (each in a session of its own, as its ids), reports
 *     `started`;
 *   - reaps whatever exits (orphans included), restarts a process by its own policy (none once
 *     the machine is told to stop: a 'T' frame, or any signal PID 1 gets), forwards signals the
 *     worker asks for to every process, runs `exec` and answers `ps`;
 *   - once the first process exits for good, asks the others to stop (SIGTERM, then SIGKILL
 *     after GRACE seconds), reports the machine's exit code and powers the guest off: through
 *     the isa-debug-exit port where the machine has one (qemu then exits with (code << 1) | 1,
 *     what the worker reads when it missed the report), else by a power-off.
 *
 * The channel's frames (vm_channel.py; big-endian): a 32-bit length of what follows, a type
 * byte, a 32-bit request id, then fields, each a 32-bit length and its bytes.
 *   worker -> guest: 'C' config (key, value, ...), 'E' exec (uid, gid, cwd, stdin, argv...),
 *                    'K' kill an exec (signal), 'S' signal the processes (signal), 'T' stop
 *                    them (signal: then nothing is restarted), 'P' ps
 *   guest -> worker: 'H' hello, 'R' started, 'F' failed (why), 'X' exit (code),
 *                    'O' exec done (code, signal, stdout, stderr), 'p' ps (one field a process)
 *
 * With `--container` it is PID 1 of a runc container (`container_main`): the same processes,
 * restarts, reaping and stop, without what only a guest needs (modules, mounts, root disk,
 * network, channel); its config comes on stdin and its exit code is the machine's.
 * Built by scripts/setup.sh, static.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PORT_NAME "souk.0"
#define DEBUG_EXIT 0xf4
#define GRACE 10
#define MAX_PROCS 32 /* the API's limit of `processes` */
#define MAX_EXECS 32
/* Fields of one frame: a config holds every process's argv and env (the API allows 32 of each
 * up to a few thousand); the array is untouched memory beyond what a frame uses. */
#define MAX_FIELDS (1 << 19)
#define MAX_PS 4096
#define MAX_OUTPUT (1 << 20)
#define NEWROOT "/newroot"

struct field {
    const char *data;
    uint32_t len;
};

/* A growing list of strings, NULL after the last (an argv, an environment). */
struct strs {
    char **v;
    int n, cap;
};

struct proc {
    struct strs argv, env;
    uid_t uid;
    gid_t gid;
    char cwd[512];
    int restart; /* 0 no, 1 always, 2 on-failure */
    int max_retries, retries; /* max_retries < 0: no limit */
    int quick;                /* restarts in a row of a process that ran briefly: the backoff */
    long long started_ms, restart_at_ms; /* restart_at_ms: a restart waits for it (0: none) */
    int last_code;
    pid_t pid;
    int done;
};

struct buf {
    char *data;
    size_t len;
};

struct exec {
    uint32_t id;
    pid_t pid;
    int out, err;
    struct buf bout, berr;
    int exited, status;
};

static int chan = -1, hvc_out = -1, hvc_err = -1;
static struct proc procs[MAX_PROCS];
static int nprocs;
static struct exec execs[MAX_EXECS];
static struct strs menv;
static uid_t exec_uid;
static gid_t exec_gid;
static char exec_cwd[512] = "/";
static int ending, exit_code = -1;
static int in_container; /* `--container`: PID 1 of a runc container, not of a guest */
static int stopping;     /* the machine was told to stop: no process is restarted */
static time_t kill_at, chan_away_until;

static void say(const char *what) {
    int fd = hvc_err >= 0 ? hvc_err : 2;
    dprintf(fd, "souk-init: %s\n", what);
}

static void sayerr(const char *what, const char *arg) {
    char line[768];
    snprintf(line, sizeof line, "%s %s: %s", what, arg, strerror(errno));
    say(line);
}

/* -- the channel ---------------------------------------------------------------------------- */

static int write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *data, size_t len) {
    char *p = data;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void put32(char *at, uint32_t v) {
    uint32_t be = htonl(v);
    memcpy(at, &be, 4);
}

static uint32_t get32(const char *at) {
    uint32_t be;
    memcpy(&be, at, 4);
    return ntohl(be);
}

/* One frame of `n` fields; a worker away (no one at the host's end) loses it. */
static void send_frame(char type, uint32_t id, int n, const struct field *fields) {
    size_t len = 5;
    for (int i = 0; i < n; i++)
        len += 4 + fields[i].len;
    char *frame = malloc(len + 4);
    if (!frame)
        return;
    put32(frame, (uint32_t)len);
    frame[4] = type;
    put32(frame + 5, id);
    size_t at = 9;
    for (int i = 0; i < n; i++) {
        put32(frame + at, fields[i].len);
        memcpy(frame + at + 4, fields[i].data, fields[i].len);
        at += 4 + fields[i].len;
    }
    write_all(chan, frame, len + 4);
    free(frame);
}

static void send_text(char type, uint32_t id, const char *text) {
    struct field f = {text, (uint32_t)strlen(text)};
    send_frame(type, id, text[0] ? 1 : 0, &f);
}

/* The next frame: its type and id, its fields pointing into *storage (the caller frees it). */
static int read_frame(char *type, uint32_t *id, struct field *fields, int *n, char **storage) {
    char head[4];
    if (read_all(chan, head, 4) < 0)
        return -1;
    uint32_t len = get32(head);
    if (len < 5 || len > (64u << 20))
        return -1;
    char *frame = malloc(len + 1);
    if (!frame || read_all(chan, frame, len) < 0) {
        free(frame);
        return -1;
    }
    *type = frame[0];
    *id = get32(frame + 1);
    *n = 0;
    uint32_t at = 5;
    while (at + 4 <= len && *n < MAX_FIELDS) {
        uint32_t flen = get32(frame + at);
        if (flen > len - at - 4)
            break;
        fields[*n].data = frame + at + 4;
        fields[*n].len = flen;
        (*n)++;
        at += 4 + flen;
    }
    *storage = frame;
    return 0;
}

static char *dup_field(struct field f) {
    char *s = malloc(f.len + 1);
    if (!s)
        exit(1);
    memcpy(s, f.data, f.len);
    s[f.len] = 0;
    return s;
}

static void push(struct strs *list, char *s) {
    if (list->n + 1 >= list->cap) {
        list->cap = list->cap ? 2 * list->cap : 16;
        list->v = realloc(list->v, (size_t)list->cap * sizeof *list->v);
        if (!list->v)
            exit(1);
    }
    list->v[list->n++] = s;
    list->v[list->n] = NULL;
}

static int is(struct field f, const char *key) {
    return f.len == strlen(key) && memcmp(f.data, key, f.len) == 0;
}

/* -- booting -------------------------------------------------------------------------------- */

static int wait_for(const char *path, int tenths) {
    for (int i = 0; i < tenths * 10; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        usleep(10000);
    }
    return -1;
}

static void load_modules(void) {
    FILE *order = fopen("/modules/order", "r");
    char name[256];
    if (!order)
        return; /* a container: the host's kernel has what it has */
    while (fgets(name, sizeof name, order)) {
        name[strcspn(name, "\n")] = 0;
        char path[300];
        snprintf(path, sizeof path, "/modules/%s", name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST)
            sayerr("cannot load", name);
        close(fd);
    }
    fclose(order);
}

/* The port named PORT_NAME: /dev/vportNpM, found by its name in sysfs (there is no udev). */
static int open_port(void) {
    for (int tries = 0; tries < 1000; tries++) {
        DIR *dir = opendir("/sys/class/virtio-ports");
        struct dirent *d;
        while (dir && (d = readdir(dir))) {
            char path[300], name[64] = {0};
            snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", d->d_name);
            int fd = open(path, O_RDONLY);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, name, sizeof name - 1);
            close(fd);
            if (n > 0 && strncmp(name, PORT_NAME, strlen(PORT_NAME)) == 0) {
                snprintf(path, sizeof path, "/dev/%s", d->d_name);
                wait_for(path, 10);
                int port = open(path, O_RDWR | O_CLOEXEC);
                closedir(dir);
                return port;
            }
        }
        if (dir)
            closedir(dir);
        usleep(10000);
    }
    return -1;
}

static void mkdirs(const char *path, mode_t mode) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, mode);
            *p = '/';
        }
    }
    mkdir(tmp, mode);
}

static int mount_under(const char *src, const char *dir, const char *type, unsigned long flags,
                       const char *data) {
    char path[1024];
    snprintf(path, sizeof path, NEWROOT "%s", dir);
    mkdirs(path, 0755);
    if (mount(src, path, type, flags, data) != 0) {
        sayerr("cannot mount", dir);
        return -1;
    }
    return 0;
}

/* The disk whose serial is `serial` (the worker names each volume's disk): /dev/vdX. */
static int find_disk(const char *serial, char *dev, size_t size) {
    for (int tries = 0; tries < 1000; tries++) {
        DIR *dir = opendir("/sys/block");
        struct dirent *d;
        while (dir && (d = readdir(dir))) {
            char path[300], found[64] = {0};
            if (strncmp(d->d_name, "vd", 2) != 0)
                continue;
            snprintf(path, sizeof path, "/sys/block/%s/serial", d->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, found, sizeof found - 1);
            close(fd);
            found[strcspn(found, "\n")] = 0;
            if (n > 0 && strcmp(found, serial) == 0) {
                snprintf(dev, size, "/dev/%s", d->d_name);
                closedir(dir);
                return wait_for(dev, 100);
            }
        }
        if (dir)
            closedir(dir);
        usleep(10000);
    }
    return -1;
}

/* A volume: "SERIAL PATH", its disk mounted at PATH below the new root, its root the guest's
 * root's (as a container's root owns its volumes). */
static int mount_volume(char *spec) {
    char dev[300], full[1024];
    char *space = strchr(spec, ' ');
    if (!space || space[1] != '/' || strstr(space, ".."))
        return -1;
    *space = 0;
    if (find_disk(spec, dev, sizeof dev) != 0) {
        sayerr("no disk for the volume", spec);
        return -1;
    }
    if (mount_under(dev, space + 1, "ext4", MS_NOSUID | MS_NODEV, NULL) != 0)
        return -1;
    snprintf(full, sizeof full, NEWROOT "%s", space + 1);
    if (chown(full, 0, 0) != 0)
        sayerr("cannot own", space + 1);
    return 0;
}

/* A file of `files`, below the new root, followed through no link at its last part. */
static int write_file(const char *path, mode_t mode, struct field data) {
    char full[1024];
    if (strstr(path, "..") || path[0] != '/')
        return -1;
    snprintf(full, sizeof full, NEWROOT "%s", path);
    char *slash = strrchr(full, '/');
    *slash = 0;
    mkdirs(full, 0755);
    *slash = '/';
    unlink(full);
    int fd = open(full, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int ok = write_all(fd, data.data, data.len) == 0 && fchmod(fd, mode) == 0;
    close(fd);
    return ok ? 0 : -1;
}

/* -- network: the address as a /32, the gateway on the link, the default route through it -- */

static int set_addr(int s, const char *ifname, unsigned long req, const char *addr) {
    struct ifreq ifr = {0};
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    sin->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &sin->sin_addr);
    return ioctl(s, req, &ifr);
}

static int link_up(int s, const char *ifname) {
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0)
        return -1;
    ifr.ifr_flags |= IFF_UP;
    return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static int add_route(int s, const char *dst, const char *gw, const char *dev) {
    struct rtentry rt = {0};
    struct sockaddr_in *d = (struct sockaddr_in *)&rt.rt_dst;
    struct sockaddr_in *g = (struct sockaddr_in *)&rt.rt_gateway;
    struct sockaddr_in *m = (struct sockaddr_in *)&rt.rt_genmask;
    d->sin_family = g->sin_family = m->sin_family = AF_INET;
    rt.rt_flags = RTF_UP;
    if (dst) {
        inet_pton(AF_INET, dst, &d->sin_addr);
        m->sin_addr.s_addr = 0xffffffff;
        rt.rt_flags |= RTF_HOST;
    }
    if (gw) {
        inet_pton(AF_INET, gw, &g->sin_addr);
        rt.rt_flags |= RTF_GATEWAY;
    }
    rt.rt_dev = (char *)dev;
    return ioctl(s, SIOCADDRT, &rt);
}

/* -- network, IPv6: the machine's private address (/128), the default route through the host's
 * veth (fe80::1 on the link). Without `addr6` (a machine off the private network) IPv4 alone. */

static const char *addr6, *gw6;

/* A key of the config that is the network's (1: taken). */
static int net_option(struct field k, const char *val) {
    if (is(k, "addr6"))
        addr6 = val;
    else if (is(k, "gw6"))
        gw6 = val;
    else
        return 0;
    return 1;
}

static void sysctl_write(const char *path, const char *value) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (write(fd, value, strlen(value)) < 0)
        sayerr("cannot set", path);
    close(fd);
}

/* Before eth0 is up: no duplicate address detection (the address would stay tentative for a
 * second; the host's end is the link's only other node) and no router advertisements (the
 * routes are the worker's, not the link's). */
static void network6_before_up(void) {
    static const char *const knobs[] = {"accept_dad", "accept_ra", "autoconf"};
    static const char *const links[] = {"all", "default", "eth0"};
    if (!addr6)
        return;
    for (size_t l = 0; l < sizeof links / sizeof *links; l++)
        for (size_t k = 0; k < sizeof knobs / sizeof *knobs; k++) {
            char path[128];
            snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/%s", links[l], knobs[k]);
            sysctl_write(path, "0");
        }
}

struct ifreq6 { /* linux/ipv6.h's in6_ifreq, which clashes with netinet/in.h */
    struct in6_addr addr;
    uint32_t prefixlen;
    int ifindex;
};

static void network6(int s4) {
    if (!addr6)
        return;
    int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int index = (int)if_nametoindex("eth0");
    struct ifreq6 req = {.prefixlen = 128, .ifindex = index};
    struct in6_rtmsg rt = {.rtmsg_flags = RTF_UP | RTF_GATEWAY, .rtmsg_metric = 1,
                           .rtmsg_ifindex = index};
    if (s < 0 || index == 0 || inet_pton(AF_INET6, addr6, &req.addr) != 1 ||
        link_up(s4, "eth0") != 0 || ioctl(s, SIOCSIFADDR, &req) != 0)
        sayerr("cannot set the private address on", "eth0");
    else if (gw6 &&
             (inet_pton(AF_INET6, gw6, &rt.rtmsg_gateway) != 1 || ioctl(s, SIOCADDRT, &rt) != 0))
        sayerr("cannot route through", gw6);
    if (s >= 0)
        close(s);
}

static void network(const char *addr, const char *gw) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return;
    link_up(s, "lo");
    network6_before_up();
    if (addr && gw) {
        if (set_addr(s, "eth0", SIOCSIFADDR, addr) != 0 ||
            set_addr(s, "eth0", SIOCSIFNETMASK, "255.255.255.255") != 0 || link_up(s, "eth0") != 0 ||
            add_route(s, gw, NULL, "eth0") != 0 || add_route(s, NULL, gw, "eth0") != 0)
            sayerr("cannot set up", "eth0");
    }
    network6(s);
    close(s);
}

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

static void child_setup(uid_t uid, gid_t gid, const char *cwd) {
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
static void run(char **argv, char **env, int envc) {
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

static int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void signal_all(int sig) {
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
static void stop_all(int sig) {
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

static void exec_done_maybe(struct exec *e) {
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

static void drain(struct exec *e, int *fd, struct buf *b) {
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

static void request(char type, uint32_t id, struct field *f, int n) {
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

/* -- the config ------------------------------------------------------------------------------ */

/* "no", "always", or "on-failure" with ":N", at most N restarts (none: no limit). */
static void restart_policy(struct proc *p, const char *val) {
    p->restart = strcmp(val, "always") == 0 ? 1 : strncmp(val, "on-failure", 10) == 0 ? 2 : 0;
    const char *colon = strchr(val, ':');
    p->max_retries = colon ? atoi(colon + 1) : -1;
}

static int configure(struct field *f, int n, const char **addr, const char **gw) {
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

/* -- the end -------------------------------------------------------------------------------- */

static void power_off(int code) {
    char text[16];
    snprintf(text, sizeof text, "%d", code);
    send_text('X', 0, text);
    sync();
    kill(-1, SIGKILL);
    umount2("/", MNT_DETACH);
    sync();
    if (ioperm(DEBUG_EXIT, 1, 1) == 0)
        outb((unsigned char)(code > 127 ? 127 : code), DEBUG_EXIT);
    reboot(RB_POWER_OFF);
    for (;;)
        pause();
}

/* The end of the machine: a container's PID 1 exits with its code (the kernel kills what is
 * left in its namespace), a guest powers off. */
static void finish(int code) {
    if (in_container)
        exit(code);
    power_off(code);
}

static void start_all(void) {
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
static void supervise(int sigfd) {
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

/* PID 1 of a runc container (`--container`, from the runc driver): /dev, /proc and /sys are
 * runc's, the kernel is the host's, the network and hostname are set by then, and the image's
 * files are in place. The config comes on stdin, one 'C' frame (the guest's, without root,
 * network or files); the processes' output goes to stdout and stderr (the machine's logs); the
 * machine's exit code is this program's. Every signal is blocked (a fault of its own still kills
 * it): one a machine can be stopped with is the stop signal, passed on to every process; others
 * are dropped. exec and ps are the driver's (runc exec, the container's cgroup). */
static int container_main(void) {
    in_container = 1;
    hvc_out = 1;
    hvc_err = 2;
    for (int i = 0; i < MAX_EXECS; i++)
        execs[i] = (struct exec){.out = -1, .err = -1};
    sigset_t mask;
    sigfillset(&mask);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sigfd = signalfd(-1, &mask, SFD_CLOEXEC);

    char type;
    uint32_t id;
    static struct field fields[MAX_FIELDS];
    int n;
    char *storage;
    chan = 0;
    if (read_frame(&type, &id, fields, &n, &storage) < 0 || type != 'C') {
        say("no config on stdin");
        return 125;
    }
    chan = -1;
    const char *addr = NULL, *gw = NULL;
    if (configure(fields, n, &addr, &gw) != 0)
        return 125;
    free(storage);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0)
        dup2(null, 0); /* the config's pipe, closed */
    start_all();
    supervise(sigfd);
    return 0;
}

int main(int argc, char **argv) {
    if (getpid() != 1) {
        fprintf(stderr, "souk-init: runs as PID 1 of a guest or a container\n");
        return 125;
    }
    if (argc > 1 && strcmp(argv[1], "--container") == 0)
        return container_main();
    for (int i = 0; i < MAX_EXECS; i++)
        execs[i] = (struct exec){.out = -1, .err = -1};
    mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, NULL);
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    load_modules();
    wait_for("/dev/hvc0", 100);
    hvc_out = open("/dev/hvc0", O_WRONLY | O_CLOEXEC);
    hvc_err = open("/dev/hvc1", O_WRONLY | O_CLOEXEC);
    if (hvc_out < 0)
        hvc_out = open("/dev/console", O_WRONLY | O_CLOEXEC);
    if (hvc_err < 0)
        hvc_err = hvc_out;
    chan = open_port();
    if (chan < 0) {
        say("no channel to the worker");
        power_off(125);
    }

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sigfd = signalfd(-1, &mask, SFD_CLOEXEC);

    char type;
    uint32_t id;
    static struct field fields[MAX_FIELDS];
    int n;
    char *storage;
    /* Hello, again each half second until the config comes: the worker sends it only once it
     * hears one (what it sent before the port was open could wait in qemu unread), and a hello
     * sent with no worker at the other end is lost. */
    struct pollfd first = {.fd = chan, .events = POLLIN};
    do {
        send_text('H', 0, "");
    } while (poll(&first, 1, 500) >= 0 && !(first.revents & POLLIN) && usleep(10000) == 0);
    if (read_frame(&type, &id, fields, &n, &storage) < 0 || type != 'C') {
        say("no config from the worker");
        power_off(125);
    }
    const char *addr = NULL, *gw = NULL;
    if (configure(fields, n, &addr, &gw) != 0) {
        send_text('F', 0, "the guest could not be configured: see the machine's stderr");
        power_off(125);
    }
    free(storage);
    network(addr, gw);
    start_all();
    send_text('R', 0, "");
    supervise(sigfd);
}
