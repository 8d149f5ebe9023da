/* What only a guest's PID 1 does (a container's has runc, and the host's kernel, for it): load
 * the kernel's modules, find the channel, mount the root disk and the volumes, write `files`,
 * set up the network, and power off at the end. */
#include "init.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/io.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* -- booting -------------------------------------------------------------------------------- */

int wait_for(const char *path, int tenths) {
    for (int i = 0; i < tenths * 10; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        usleep(10000);
    }
    return -1;
}

void load_modules(void) {
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
int open_port(void) {
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

int mount_under(const char *src, const char *dir, const char *type, unsigned long flags,
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
int mount_volume(char *spec) {
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
int write_file(const char *path, mode_t mode, struct field data) {
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
int net_option(struct field k, const char *val) {
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

void network(const char *addr, const char *gw) {
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

/* -- the end -------------------------------------------------------------------------------- */

void power_off(int code) {
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
