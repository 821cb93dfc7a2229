/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host backend: a host pool is a memfd mapped into this process, the
 * CPU kernels (kernels/cpu) work on it and have finished when they return,
 * so there is never anything to wait for, and an attention call is timed
 * with the CPU clock around it.  A batch's sequences are shared out to a
 * team of threads (team.h), each sequence's kernel call on one of them:
 * the bytes and outputs are those of one call over all of them.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "libkvq_internal.h"
#include "team.h"

static int host_map(kvq_client *c, int fd, uint64_t map_bytes, int device, const uint8_t *uuid, size_t uuid_len)
{
	void *base = mmap(NULL, (size_t)map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	(void)device, (void)uuid, (void)uuid_len;
	if (base == MAP_FAILED)
		return client_fail(c, -errno, "mapping the pool: %s", strerror(errno));
	c->base = base;
	c->map_bytes = (size_t)map_bytes;
	return 0;
}

static void host_unmap(kvq_client *c)
{
	team_free(c->team);
	c->team = NULL;
	munmap(c->base, c->map_bytes);
	c->base = NULL;
}

/* One pass of the batch's kernel calls: fn(arg, i) for each sequence, on
 * the client's team once there is more than one. */
static int host_pass(kvq_client *c, uint32_t nseq, int (*fn)(void *arg, uint32_t i), void *arg)
{
	if (nseq > 1 && !c->team)
		c->team = team_new(team_default_threads());
	if (nseq > 1 && c->team)
		return team_run(c->team, nseq, fn, arg);
	for (uint32_t i = 0; i < nseq; i++) {
		int r = fn(arg, i);
		if (r < 0)
			return r;
	}
	return 0;
}

struct host_call {
	kvq_client *c;
	const struct client_tables *t;
	uint32_t layer;
	const void *k, *v;              /* a write's */
	const struct kvq_attn *a;       /* an attention's */
	const void *q;
	void *out;
};

static int host_write_one(void *arg, uint32_t i)
{
	const struct host_call *x = arg;

	return kvq_cpu_write(x->c->L, x->c->base, x->layer, &x->t->t[i], x->k, x->v);
}

static int host_attention_one(void *arg, uint32_t i)
{
	const struct host_call *x = arg;

	return kvq_cpu_attention(x->a, &x->t->t[i], 1, x->q, x->out);
}

/* Every sequence's rows of one layer, from the caller's arrays. */
static int host_write(kvq_client *c, struct client_tables *w, uint32_t layer, const void *k, const void *v)
{
	const struct host_call x = { .c = c, .t = w, .layer = layer, .k = k, .v = v };
	int r;

	client_trace(c, KVQ_TRACE_WRITE, layer, false, k, v, NULL, NULL);
	r = host_pass(c, w->nseq, host_write_one, (void *)&x);
	return r < 0 ? client_fail(c, r, "kvq_cpu_write refused a block table") : 0;
}

/* Every sequence's queries of one layer. */
static int host_attention(kvq_client *c, struct client_tables *t, uint32_t layer, uint32_t q_heads, float scale,
			  const float *q, float *out)
{
	const struct kvq_attn a = { .L = c->L, .base = c->base, .layer = layer, .q_heads = q_heads,
		.scale = scale, .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	const struct host_call x = { .c = c, .t = t, .layer = layer, .a = &a, .q = q, .out = out };
	double t0 = c->timing.report_ms ? timing_now() : 0;
	int r;

	client_trace(c, KVQ_TRACE_ATTENTION, layer, false, NULL, NULL, q, out);
	r = host_pass(c, t->nseq, host_attention_one, (void *)&x);
	if (r < 0)
		return client_fail(c, r, "attention: bad query counts");
	if (c->timing.report_ms)
		timing_add(c, layer, timing_phase(t->max_m), timing_kv_bytes(c, layer, t), timing_now() - t0);
	return 0;
}

static int host_copy(kvq_client *c, void *to, const void *from, size_t n)
{
	(void)c;
	memcpy(to, from, n);
	return 0;
}

static int host_drain(kvq_client *c)
{
	(void)c;
	return 0;
}

const struct client_backend client_host = {
	.name = "host",
	.compiled = true,
	.sinks = true,
	.map = host_map,
	.unmap = host_unmap,
	.write = host_write,
	.attention = host_attention,
	.copy = host_copy,
	.drain = host_drain,
};
