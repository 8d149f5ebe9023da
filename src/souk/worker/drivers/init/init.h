/* souk-init's shared declarations: its limits, the state its parts share, and what each part
 * (channel.c, config.c, guest.c, procs.c, serve.c, main.c) offers the others. */
#ifndef SOUK_INIT_H
#define SOUK_INIT_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/* channel.c: the frames, and what souk-init says of itself */
extern int chan, hvc_out, hvc_err;
void say(const char *what);
void sayerr(const char *what, const char *arg);
int write_all(int fd, const void *data, size_t len);
void send_frame(char type, uint32_t id, int n, const struct field *fields);
void send_text(char type, uint32_t id, const char *text);
int read_frame(char *type, uint32_t *id, struct field *fields, int *n, char **storage);
char *dup_field(struct field f);
void push(struct strs *list, char *s);
int is(struct field f, const char *key);

/* config.c: the 'C' frame */
int configure(struct field *f, int n, const char **addr, const char **gw);

/* guest.c: what only a guest needs */
int wait_for(const char *path, int tenths);
void load_modules(void);
int open_port(void);
int mount_under(const char *src, const char *dir, const char *type, unsigned long flags,
                const char *data);
int mount_volume(char *spec);
int write_file(const char *path, mode_t mode, struct field data);
int net_option(struct field k, const char *val);
void network(const char *addr, const char *gw);
void power_off(int code);

/* procs.c: the processes, and the loop PID 1 ends in */
extern struct proc procs[MAX_PROCS];
extern int nprocs;
extern int in_container; /* `--container`: PID 1 of a runc container, not of a guest */
void child_setup(uid_t uid, gid_t gid, const char *cwd);
void run(char **argv, char **env, int envc);
int status_code(int status);
void signal_all(int sig);
void stop_all(int sig);
void start_all(void);
void supervise(int sigfd);

/* serve.c: exec, signals and ps, the worker's requests of a guest */
extern struct exec execs[MAX_EXECS];
extern struct strs menv;
extern uid_t exec_uid;
extern gid_t exec_gid;
extern char exec_cwd[512];
void exec_done_maybe(struct exec *e);
void drain(struct exec *e, int *fd, struct buf *b);
void request(char type, uint32_t id, struct field *f, int n);

#endif
