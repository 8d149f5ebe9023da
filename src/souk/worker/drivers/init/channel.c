/* souk-init's channel to the worker, and what it says of itself (on the guest's hvc1, else its
 * stderr).
 *
 * The channel's frames (vm_channel.py; big-endian): a 32-bit length of what follows, a type
 * byte, a 32-bit request id, then fields, each a 32-bit length and its bytes.
 *   worker -> guest: 'C' config (key, value, ...), 'E' exec (uid, gid, cwd, stdin, argv...),
 *                    'K' kill an exec (signal), 'S' signal the processes (signal), 'T' stop
 *                    them (signal: then nothing is restarted), 'P' ps
 *   guest -> worker: 'H' hello, 'R' started, 'F' failed (why), 'X' exit (code),
 *                    'O' exec done (code, signal, stdout, stderr), 'p' ps (one field a process)
 * A container's PID 1 reads its one 'C' frame on stdin and has no channel after it.
 */
#include "init.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int chan = -1, hvc_out = -1, hvc_err = -1;

void say(const char *what) {
    int fd = hvc_err >= 0 ? hvc_err : 2;
    dprintf(fd, "souk-init: %s\n", what);
}

void sayerr(const char *what, const char *arg) {
    char line[768];
    snprintf(line, sizeof line, "%s %s: %s", what, arg, strerror(errno));
    say(line);
}

/* -- the channel ---------------------------------------------------------------------------- */

int write_all(int fd, const void *data, size_t len) {
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
void send_frame(char type, uint32_t id, int n, const struct field *fields) {
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

void send_text(char type, uint32_t id, const char *text) {
    struct field f = {text, (uint32_t)strlen(text)};
    send_frame(type, id, text[0] ? 1 : 0, &f);
}

/* The next frame: its type and id, its fields pointing into *storage (the caller frees it). */
int read_frame(char *type, uint32_t *id, struct field *fields, int *n, char **storage) {
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

char *dup_field(struct field f) {
    char *s = malloc(f.len + 1);
    if (!s)
        exit(1);
    memcpy(s, f.data, f.len);
    s[f.len] = 0;
    return s;
}

void push(struct strs *list, char *s) {
    if (list->n + 1 >= list->cap) {
        list->cap = list->cap ? 2 * list->cap : 16;
        list->v = realloc(list->v, (size_t)list->cap * sizeof *list->v);
        if (!list->v)
            exit(1);
    }
    list->v[list->n++] = s;
    list->v[list->n] = NULL;
}

int is(struct field f, const char *key) {
    return f.len == strlen(key) && memcmp(f.data, key, f.len) == 0;
}
