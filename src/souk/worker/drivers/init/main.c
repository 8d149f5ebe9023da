/* souk-init: PID 1 of a souk microVM guest, and of a runc container.
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
 * With `--container` it is PID 1 of a runc container (`container_main`): the same processes,
 * restarts, reaping and stop, without what only a guest needs (modules, mounts, root disk,
 * network, channel); its config comes on stdin and its exit code is the machine's.
 *
 * Its parts: channel.c (the frames, their format), config.c (the config), guest.c (what only a
 * guest needs), procs.c (the processes and the loop PID 1 ends in), serve.c (exec, signals, ps).
 * Built by scripts/setup.sh, static, from this directory's .c files.
 */
#include "init.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <unistd.h>

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
