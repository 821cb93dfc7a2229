/* SPDX-License-Identifier: Apache-2.0 */
/* A host pool's memory populated by a thread of its own (warm.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "warm.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   /* Linux 5.14 */
#endif

#define WARM_STEP (4u << 20)   /* a step: the stop flag is read between steps */

struct kvq_warm {
	pthread_t thread;
	uint8_t *map;
	uint64_t size;
	atomic_bool stop;
};

/* Without MADV_POPULATE_WRITE: one read per page, which has the kernel
 * clear the page (the costly part); the first write only maps it
 * writable. */
static void warm_read(const uint8_t *p, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);

	for (size_t o = 0; o < len; o += (size_t)(page > 0 ? page : 4096))
		(void)*(const volatile uint8_t *)(p + o);
}

static void *warm_run(void *arg)
{
	struct kvq_warm *w = arg;
	bool populate = true;
	sigset_t all;

	pthread_setname_np(pthread_self(), "kvqd-warm");
	/* the loop's signals are not this thread's */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* the request path first: this thread only takes idle time */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
	for (uint64_t off = 0; off < w->size && !atomic_load(&w->stop); off += WARM_STEP) {
		size_t len = w->size - off < WARM_STEP ? (size_t)(w->size - off) : WARM_STEP;
		int r = populate ? madvise(w->map + off, len, MADV_POPULATE_WRITE) : 0;

		if (r < 0 && errno == EINVAL)
			populate = false;   /* before Linux 5.14 */
		else if (r < 0)
			break;   /* no memory for page tables: left to first touch */
		if (!populate)
			warm_read(w->map + off, len);
	}
	return NULL;
}

kvq_warm *kvq_warm_start(void *map, uint64_t size)
{
	struct kvq_warm *w = calloc(1, sizeof *w);

	if (!w || !map || !size)
		goto fail;
	w->map = map;
	w->size = size;
	atomic_init(&w->stop, false);
	if (pthread_create(&w->thread, NULL, warm_run, w) != 0)
		goto fail;
	return w;
fail:
	free(w);
	return NULL;
}

void kvq_warm_stop(kvq_warm *w)
{
	if (!w)
		return;
	atomic_store(&w->stop, true);
	pthread_join(w->thread, NULL);
	free(w);
}
