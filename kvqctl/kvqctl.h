/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqctl, the admin CLI of kvqd (kvqctl(1)), by job: main.c reads the
 * command line and holds the command table, commands.c has the commands
 * that ask kvqd (over proto/conn.h), show.c shows what Stats carries,
 * plan.c the plan calculator (no daemon), json.c the JSON writer.  Bytes per token come from the pool
 * layout code (kernels/layout.h), so its figures are the pool's.
 *
 * Exit status: 0 success, 1 a failure (one line on stderr: daemon not
 * running, permission denied, unknown pool, ...), 2 a usage error.
 */
#ifndef KVQCTL_H
#define KVQCTL_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#define PROG "kvqctl"

/* The global options (main.c) and a command's own, with the terminating
 * row, share one getopt table of CTL_MAX_OPTS + 1 rows. */
#define CTL_N_GLOBAL 4
#define CTL_MAX_OPTS 32
#define CTL_OPTS_FIT(opts) \
	_Static_assert(CTL_N_GLOBAL + sizeof(opts) / sizeof((opts)[0]) <= CTL_MAX_OPTS + 1, \
		       #opts ": CTL_MAX_OPTS is too small")

struct cmdline;

/* A row of the command table (main.c). */
struct command {
	const char *name, *sub;        /* "pool", "create"; sub NULL: a one-word command */
	const char *args;              /* the synopsis after the command's words */
	const char *summary;           /* one line */
	const char *details;           /* its options and more, for COMMAND --help (or NULL) */
	const struct option *opts;     /* its own options, NULL-terminated (or NULL) */
	int (*run)(struct cmdline *);  /* the exit status */
};

/* A command line being read: cmd_next() returns the command's options one
 * at a time; at the end argc/argv hold the command's arguments. */
struct cmdline {
	const struct command *cmd;     /* NULL: before the command */
	int argc, status;              /* status: the exit status after CL_EXIT */
	char **argv;
	const char *socket;            /* --socket; NULL: kvq_default_socket */
	bool json;                     /* --json */
	struct option lo[CTL_MAX_OPTS + 1];
};

enum { CL_END = -1, CL_EXIT = -2 };

/* "kvqctl: " and the message on stderr; returns 1. */
__attribute__((format(printf, 1, 2)))
int die(const char *fmt, ...);

/* The next option of the command (its val), CL_END when the options end
 * (cl->argc/argv: the arguments), CL_EXIT when kvqctl should exit with
 * cl->status (--help or --version printed, or a usage error). */
int cmd_next(struct cmdline *cl);

/* A wrong number of arguments: the command's synopsis, exit status 2. */
int cmd_usage(const struct cmdline *cl);

/* For a command without options of its own: reads the global ones, then
 * checks that min..max arguments follow.  -1 to go on, else the exit
 * status. */
int cmd_args(struct cmdline *cl, int min, int max);

/* The long name of option ch in lo. */
const char *opt_name(const struct option *lo, int ch);

/* Decimal count in [lo, hi]: 0 or -EINVAL. */
int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret);

/* A size: a number (decimals allowed) with an optional unit.  K, M, G, T
 * and KiB .. TiB are powers of 1024, as in kvqd.conf; KB, MB, GB, TB are
 * powers of 1000, as GPU memory and model weights are usually quoted.
 * Returns 0, -EINVAL or -ERANGE. */
int parse_size(const char *s, double *ret);

/* commands.c */
extern const struct option pool_create_opts[];
int cmd_stats(struct cmdline *cl);
int cmd_pools(struct cmdline *cl);
int cmd_clients(struct cmdline *cl);
int cmd_evict(struct cmdline *cl);   /* evict POOL [N], flush POOL */
int cmd_pool_create(struct cmdline *cl);
int cmd_pool_drop(struct cmdline *cl);

/* plan.c */
extern const struct option plan_opts[];
int cmd_plan(struct cmdline *cl);

#endif
