/* SPDX-License-Identifier: Apache-2.0 */
/* Client processes whose pidfds the service manager keeps (procs.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "keep.h"
#include "log.h"
#include "procs.h"

struct proc {
	pid_t pid;
	uint64_t start;
	uint32_t refs;
	uint32_t restored;     /* of refs, restored holds' */
	int fd;                /* its stored pidfd taken back at start (watched), or -1 */
	bool stored;           /* its FDSTORE=1 went or waits */
	struct event *ev;      /* watches fd (restored holds), or NULL */
	kvq_procs *ps;
};

struct kvq_procs {
	struct event_base *base;
	const struct kvq_keep *keep;
	kvq_procs_exit_fn *on_exit;
	void *arg;
	struct proc **p;
	size_t n, cap;
	bool stopping;
};

static void proc_on_exit(evutil_socket_t fd, short what, void *arg);

int kvq_procs_new(struct event_base *base, const struct kvq_keep *keep, kvq_procs_exit_fn *on_exit, void *arg,
		  kvq_procs **ret)
{
	kvq_procs *ps = calloc(1, sizeof(*ps));

	if (!ps)
		return -ENOMEM;
	*ps = (kvq_procs){ .base = base, .keep = keep, .on_exit = on_exit, .arg = arg };
	*ret = ps;
	return 0;
}

void kvq_procs_name(char *buf, size_t len, pid_t pid, uint64_t start)
{
	snprintf(buf, len, KVQ_PROCS_PREFIX "%d.%" PRIu64, (int)pid, start);
}

int kvq_procs_parse(const char *name, pid_t *ret_pid, uint64_t *ret_start)
{
	const size_t n = strlen(KVQ_PROCS_PREFIX);
	unsigned long long start;
	int pid, end = 0;

	if (strncmp(name, KVQ_PROCS_PREFIX, n) || sscanf(name + n, "%d.%llu%n", &pid, &start, &end) != 2 ||
	    name[n + end] || pid <= 0)
		return 0;
	*ret_pid = pid;
	*ret_start = start;
	return 1;
}

static struct proc *find(const kvq_procs *ps, pid_t pid, uint64_t start, size_t *ret_i)
{
	for (size_t i = 0; i < ps->n; i++)
		if (ps->p[i]->pid == pid && ps->p[i]->start == start) {
			if (ret_i)
				*ret_i = i;
			return ps->p[i];
		}
	return NULL;
}

static struct proc *get(kvq_procs *ps, pid_t pid, uint64_t start)
{
	struct proc *p = find(ps, pid, start, NULL);

	if (p)
		return p;
	if (ps->n == ps->cap) {
		size_t cap = ps->cap ? 2 * ps->cap : 16;
		struct proc **m = realloc(ps->p, cap * sizeof(*m));

		if (!m)
			return NULL;
		ps->p = m;
		ps->cap = cap;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	*p = (struct proc){ .pid = pid, .start = start, .fd = -1, .ps = ps };
	ps->p[ps->n++] = p;
	return p;
}

static void proc_free(struct proc *p)
{
	if (p->ev)
		event_free(p->ev);
	if (p->fd >= 0)
		close(p->fd);
	free(p);
}

void kvq_procs_hold(kvq_procs *ps, pid_t pid, uint64_t start, int pidfd)
{
	static struct kvq_log_limit rl;
	struct proc *p;
	char name[64];
	int r;

	if (!ps || pid <= 0 || !start)
		return;
	p = get(ps, pid, start);
	if (!p) {
		kvq_log_limited(&rl, LOG_WARNING, "pid %d: out of memory: its pidfd is not stored", (int)pid);
		return;
	}
	p->refs++;
	/* the store gets a copy: kvqd keeps none (the connection has its own);
	 * one that was dropped is tried again by the next connection */
	if (p->stored || pidfd < 0 || ps->stopping)
		return;
	kvq_procs_name(name, sizeof(name), pid, start);
	/* -ENOBUFS, a manager that reads late, is logged where it is known */
	r = ps->keep->store(ps->keep->arg, name, pidfd, true);
	p->stored = r == 0;
	if (r < 0 && r != -ENOBUFS)
		kvq_log_limited(&rl, LOG_WARNING, "pid %d: its pidfd is not stored: %s", (int)pid, strerror(-r));
}

void kvq_procs_adopt(kvq_procs *ps, pid_t pid, uint64_t start)
{
	struct proc *p;
	char name[64];

	if (!ps)
		return;
	p = get(ps, pid, start);
	if (!p) {
		kvq_log(LOG_WARNING, "restart: pid %d: out of memory: its exit is seen each second", (int)pid);
		return;
	}
	p->refs++;
	p->restored++;
	if (p->fd >= 0)
		return;
	kvq_procs_name(name, sizeof(name), pid, start);
	p->fd = ps->keep->take(ps->keep->arg, name);
	if (p->fd < 0)
		return;
	p->stored = true;
	/* a pidfd turns readable when its process exits */
	p->ev = event_new(ps->base, p->fd, EV_READ, proc_on_exit, p);
	if (!p->ev || event_add(p->ev, NULL) < 0) {
		kvq_log(LOG_WARNING, "restart: pid %d: its pidfd cannot be watched: its exit is seen each second",
			(int)pid);
		if (p->ev)
			event_free(p->ev);
		p->ev = NULL;
		return;
	}
	kvq_log(LOG_DEBUG, "restart: pid %d: its stored pidfd is watched", (int)pid);
}

static void proc_on_exit(evutil_socket_t fd, short what, void *arg)
{
	struct proc *p = arg;
	kvq_procs *ps = p->ps;

	kvq_log(LOG_INFO, "restart: pid %d exited (its pidfd says so)", (int)p->pid);
	/* the holds' end puts the record, maybe its last count: p is not
	 * touched after */
	ps->on_exit(ps->arg, p->pid, p->start);
}

void kvq_procs_put(kvq_procs *ps, pid_t pid, uint64_t start, bool restored)
{
	struct proc *p;
	char name[64];
	size_t i;

	if (!ps || !(p = find(ps, pid, start, &i)))
		return;
	if (restored && p->restored && --p->restored == 0 && p->fd >= 0) {
		/* nothing to watch for any more: the store keeps its copy */
		if (p->ev)
			event_free(p->ev);
		p->ev = NULL;
		close(p->fd);
		p->fd = -1;
	}
	if (--p->refs > 0)
		return;
	if (p->stored && !ps->stopping) {
		kvq_procs_name(name, sizeof(name), pid, start);
		ps->keep->remove(ps->keep->arg, name, true);
	}
	ps->p[i] = ps->p[--ps->n];
	proc_free(p);
}

bool kvq_procs_known(const kvq_procs *ps, pid_t pid, uint64_t start)
{
	return ps && find(ps, pid, start, NULL);
}

size_t kvq_procs_count(const kvq_procs *ps, size_t *ret_watched)
{
	size_t w = 0;

	for (size_t i = 0; ps && i < ps->n; i++)
		w += ps->p[i]->ev != NULL;
	if (ret_watched)
		*ret_watched = w;
	return ps ? ps->n : 0;
}

void kvq_procs_stop(kvq_procs *ps)
{
	if (ps)
		ps->stopping = true;
}

void kvq_procs_free(kvq_procs *ps)
{
	if (!ps)
		return;
	for (size_t i = 0; i < ps->n; i++)
		proc_free(ps->p[i]);
	free(ps->p);
	free(ps);
}
