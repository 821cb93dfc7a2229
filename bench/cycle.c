/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench control's batched decode cycle (control.h): decode steps of a
 * batch of sequences through libkvq's public API, kvq_batch, as a serving
 * engine runs them; what each step sent comes from kvq_batch_requests.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "control.h"
#include "kvq.h"
#include "kvq_format.h"

#define CYCLE_MAX 256u          /* the largest batch: the pool's slots are sized for it */
#define CYCLE_N_OPEN 1024u      /* a slot per sequence, a second while it crosses a block */
#define CYCLE_N_SEALED 4096u    /* 7 sealed blocks per sequence, reservations, the cache */
#define CYCLE_ROWS (CYCLE_MAX * CYCLE_SEQ_TOKENS)   /* the prefill step's rows at most */

struct cycle {
	kvq_client *c;
	kvq_batch *b;
	kvq_seq *seq[CYCLE_MAX];
	uint32_t n;
	uint16_t *k, *v;            /* CYCLE_ROWS rows of K and V: what is written is not the point */
	uint32_t *tok;              /* CYCLE_ROWS tokens, drawn per step */
	uint32_t blocks[CYCLE_MAX], sealed[CYCLE_MAX];   /* each table before the step */
	uint64_t seed;
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 3, 4)))
static int cycle_fail(struct cycle *y, int r, const char *fmt, ...)
{
	va_list ap;
	size_t n;

	va_start(ap, fmt);
	vsnprintf(y->err, y->errlen, fmt, ap);
	va_end(ap);
	n = strlen(y->err);
	if (y->c && *kvq_client_error(y->c))
		snprintf(y->err + n, y->errlen - n, ": %s", kvq_client_error(y->c));
	else
		snprintf(y->err + n, y->errlen - n, ": %s", kvq_strerror(r));
	return r;
}

static int cycle_open(struct cycle *y, const char *socket, const char *pool)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = CTL_MODEL, .layers = CTL_LAYERS,
		.kv_heads = CTL_HEADS, .head_dim = CTL_HEAD_DIM, .block_tokens = CTL_BLOCK_TOKENS,
		.policy = CTL_POLICY, .act = KVQ_ACT_F16, .create = 1, .n_sealed = CYCLE_N_SEALED,
		.n_open = CYCLE_N_OPEN, .device = -1 };
	const size_t vals = (size_t)CYCLE_ROWS * CTL_HEADS * CTL_HEAD_DIM;
	struct timespec ts;
	int r;

	y->k = malloc(vals * sizeof *y->k);
	y->v = malloc(vals * sizeof *y->v);
	y->tok = malloc((size_t)CYCLE_ROWS * sizeof *y->tok);
	if (!y->k || !y->v || !y->tok)
		return cycle_fail(y, -ENOMEM, "batched cycle");
	/* tokens no earlier run on the pool drew: nothing deduplicates */
	clock_gettime(CLOCK_REALTIME, &ts);
	y->seed = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ((uint64_t)getpid() << 40);
	for (size_t i = 0; i < vals; i++) {
		y->k[i] = kvq_f16_from_f32(rng_normal(&y->seed));
		y->v[i] = kvq_f16_from_f32(rng_normal(&y->seed));
	}
	r = kvq_client_connect(socket, PROG, &y->c);
	if (r < 0) {
		y->c = NULL;
		return cycle_fail(y, r, "batched cycle: cannot connect to %s", socket ? socket : "kvqd");
	}
	r = kvq_client_attach(y->c, &p);
	if (r < 0)
		return cycle_fail(y, r, "batched cycle: attach to pool %s", pool);
	r = kvq_batch_new(y->c, &y->b);
	if (r < 0)
		return cycle_fail(y, r, "batched cycle: a batch");
	return 0;
}

static void cycle_close(struct cycle *y)
{
	kvq_batch_free(y->b);
	for (uint32_t i = 0; i < y->n; i++)
		kvq_seq_free(y->seq[i]);
	kvq_client_free(y->c);
	free(y->k);
	free(y->v);
	free(y->tok);
}

/* Blocks of sequence i's table: *ret_sealed sealed, the return all. */
static uint32_t cycle_blocks(const struct cycle *y, uint32_t i, uint32_t *ret_sealed)
{
	uint32_t ns = 0, no = 0;

	kvq_seq_blocks(y->seq[i], NULL, &ns, NULL, &no);
	*ret_sealed = ns;
	return ns + no;
}

/*
 * One step: sequence i appends m[i] tokens (m NULL: one each), every layer
 * written, committed; *ret (may be NULL) gets its block operations and
 * what kvq_batch_requests says it sent.
 */
static int cycle_step(struct cycle *y, const uint32_t *m, struct cycle_result *ret)
{
	uint32_t req[2], waits[2];
	const uint32_t *indptr;
	size_t off = 0;
	int r = kvq_batch_clear(y->b);

	for (uint32_t i = 0; i < y->n && r >= 0; i++) {
		uint32_t mi = m ? m[i] : 1;

		for (uint32_t t = 0; t < mi; t++)
			y->tok[off + t] = (uint32_t)rng_next(&y->seed);
		r = kvq_batch_add(y->b, y->seq[i], y->tok + off, mi, 0);
		off += mi;
		y->blocks[i] = cycle_blocks(y, i, &y->sealed[i]);
	}
	if (r < 0)
		return cycle_fail(y, r, "batched cycle: kvq_batch_add");
	r = kvq_batch_begin(y->b, NULL);
	if (r < 0)
		return cycle_fail(y, r, "batched cycle: kvq_batch_begin of %u sequences", y->n);
	indptr = kvq_batch_indptr(y->b, NULL);
	if (!indptr || indptr[y->n] > CYCLE_ROWS) {
		kvq_batch_abort(y->b);
		return cycle_fail(y, -EPROTO, "batched cycle: the step's rows");
	}
	for (uint32_t l = 0; l < CTL_LAYERS && r == 0; l++)
		r = kvq_batch_write(y->b, l, y->k, y->v);
	if (r < 0) {
		kvq_batch_abort(y->b);
		return cycle_fail(y, r, "batched cycle: kvq_batch_write");
	}
	kvq_batch_requests(y->b, KVQ_BATCH_BEGIN, &req[0], &waits[0]);
	r = kvq_batch_commit(y->b);
	if (r < 0)
		return cycle_fail(y, r, "batched cycle: kvq_batch_commit");
	kvq_batch_requests(y->b, KVQ_BATCH_COMMIT, &req[1], &waits[1]);
	if (!ret)
		return 0;
	for (uint32_t i = 0; i < y->n; i++) {
		uint32_t ns, nb = cycle_blocks(y, i, &ns);

		/* a decode step only grows a table: new blocks were allocated,
		 * newly sealed ones sealed and published */
		ret->allocs += nb - y->blocks[i];
		ret->seals += ns - y->sealed[i];
		ret->publishes += ns - y->sealed[i];
	}
	ret->begin_requests += req[0];
	ret->begin_waits += waits[0];
	ret->commit_requests += req[1];
	ret->commit_waits += waits[1];
	ret->steps++;
	return 0;
}

/* Frees the sequences that reached CYCLE_SEQ_TOKENS (one Release each)
 * and puts empty ones in their place. */
static int cycle_renew(struct cycle *y, struct cycle_result *ret)
{
	for (uint32_t i = 0; i < y->n; i++) {
		uint32_t ns;
		int r;

		if (kvq_seq_tokens(y->seq[i]) < CYCLE_SEQ_TOKENS)
			continue;
		ret->releases += cycle_blocks(y, i, &ns);
		ret->ended++;
		kvq_seq_free(y->seq[i]);
		r = kvq_seq_new(y->c, NULL, 0, &y->seq[i]);
		if (r < 0) {
			/* the freed one's place goes to the last: cycle_close frees the rest */
			y->seq[i] = y->seq[--y->n];
			return cycle_fail(y, r, "batched cycle: a sequence");
		}
	}
	return 0;
}

int cycle_run(const char *socket, const char *pool, uint32_t size, double seconds, struct cycle_result *ret,
	      char *err, size_t errlen)
{
	struct cycle y = { .err = err, .errlen = errlen };
	struct cycle_result o = { .size = size };
	uint32_t m[CYCLE_MAX];
	double t0, deadline;
	int r;

	if (size < 1 || size > CYCLE_MAX) {
		snprintf(err, errlen, "batched cycle: %u sequences (1 .. %u)", size, CYCLE_MAX);
		return -EINVAL;
	}
	r = cycle_open(&y, socket, pool);
	for (; r == 0 && y.n < size; y.n++) {
		r = kvq_seq_new(y.c, NULL, 0, &y.seq[y.n]);
		if (r < 0)
			r = cycle_fail(&y, r, "batched cycle: a sequence");
	}
	if (r < 0)
		goto out;
	/* lengths spread over 1 .. CYCLE_SEQ_TOKENS: boundaries are crossed,
	 * and sequences end, a few at a time */
	for (uint32_t i = 0; i < size; i++)
		m[i] = 1 + (uint32_t)((uint64_t)i * CYCLE_SEQ_TOKENS / size) % CYCLE_SEQ_TOKENS;
	r = cycle_step(&y, m, NULL);
	t0 = now_s();
	deadline = t0 + seconds;
	while (r == 0 && now_s() < deadline) {
		r = cycle_renew(&y, &o);
		if (r == 0)
			r = cycle_step(&y, NULL, &o);
	}
	o.seconds = now_s() - t0;
	if (r == 0)
		*ret = o;
out:
	cycle_close(&y);
	return r;
}
