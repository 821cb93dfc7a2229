/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier's copies of a pool kvqd does not map: daemon/rstage.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/mman.h>

#include "blockrec.h"
#include "rstage.h"
#include "seterr.h"

struct kvq_rstage {
	struct kvq_backend_mem *mem;
	const struct kvq_layout *L;
	struct kvq_backend_chan *chan;
	uint8_t *host;                   /* two records: the loop's, then the copy thread's */
	uint64_t rec_max, host_len;
	struct kvq_backend_run *runs[2]; /* each thread's, L->layers */
};

void kvq_rstage_close(struct kvq_rstage *s)
{
	if (!s)
		return;
	if (s->chan)
		s->mem->backend->chan_close(s->chan);
	if (s->host)
		munmap(s->host, s->host_len);
	free(s->runs[0]);
	free(s->runs[1]);
	free(s);
}

int kvq_rstage_open(struct kvq_backend_mem *mem, const struct kvq_layout *L, struct kvq_rstage **ret, char *err,
		    size_t errlen)
{
	const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
	struct kvq_rstage *s;
	int r;

	if (!mem->backend->chan_open)
		return kvq_seterr(err, errlen, "the %s backend has no copy channel", mem->backend->name), -EOPNOTSUPP;
	s = calloc(1, sizeof *s);
	if (!s)
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	s->mem = mem;
	s->L = L;
	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		if (kvq_blockrec_size(L, c) > s->rec_max)
			s->rec_max = kvq_blockrec_size(L, c);
	/* whole pages: what is pinned is what is mapped */
	s->host_len = (s->rec_max * 2 + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
	s->runs[0] = calloc(L->layers, sizeof *s->runs[0]);
	s->runs[1] = calloc(L->layers, sizeof *s->runs[1]);
	s->host = mmap(NULL, s->host_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->host == MAP_FAILED)
		s->host = NULL;
	if (!s->rec_max || !s->runs[0] || !s->runs[1] || !s->host) {
		kvq_rstage_close(s);
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	r = mem->backend->chan_open(mem, s->host, s->host_len, &s->chan, err, errlen);
	if (r < 0) {
		kvq_rstage_close(s);
		return r;
	}
	*ret = s;
	return 0;
}

int kvq_rstage_pull(struct kvq_rstage *s, struct kvq_block_ref r, const uint8_t **ret, char *err, size_t errlen)
{
	int rc;

	kvq_backend_block_runs(s->L, r, s->host, s->runs[0]);
	rc = s->mem->backend->chan_copy(s->chan, 1, s->runs[0], s->L->layers, err, errlen);
	if (rc == 0)
		*ret = s->host;
	return rc;
}

int kvq_rstage_push(struct kvq_rstage *s, struct kvq_block_ref r, const void *rec, char *err, size_t errlen)
{
	uint8_t *stage = s->host + s->rec_max;
	const uint64_t at = kvq_blockrec_slice_at(s->L, r.cls, 0);

	/* the slices: they end the record (kernels/blockrec.h) */
	memcpy(stage + at, (const uint8_t *)rec + at, kvq_blockrec_size(s->L, r.cls) - at);
	kvq_backend_block_runs(s->L, r, stage, s->runs[1]);
	return s->mem->backend->chan_copy(s->chan, 0, s->runs[1], s->L->layers, err, errlen);
}
