/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host backend: a host pool is a memfd mapped into this process, the
 * CPU kernels (kernels/cpu) work on it and have finished when they return,
 * so there is never anything to wait for, and an attention call is timed
 * with the CPU clock around it.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "libkvq_internal.h"

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
	munmap(c->base, c->map_bytes);
	c->base = NULL;
}

/* One pass over the step's sequences: each one's rows, from the
 * caller's arrays. */
static int host_write(kvq_client *c, struct client_tables *w, uint32_t layer, const void *k, const void *v)
{
	client_trace(c, KVQ_TRACE_WRITE, layer, false, k, v, NULL, NULL);
	for (uint32_t i = 0; i < w->nseq; i++) {
		int r = kvq_cpu_write(c->L, c->base, layer, &w->t[i], k, v);

		if (r < 0)
			return client_fail(c, r, "kvq_cpu_write refused the block table of sequence %u", i);
	}
	return 0;
}

/* Every sequence's rows in one kernel call. */
static int host_attention(kvq_client *c, struct client_tables *t, uint32_t layer, uint32_t q_heads, float scale,
			  const float *q, float *out)
{
	const struct kvq_attn a = { .L = c->L, .base = c->base, .layer = layer, .q_heads = q_heads,
		.scale = scale, .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	double t0 = c->timing.report_ms ? timing_now() : 0;
	int r;

	client_trace(c, KVQ_TRACE_ATTENTION, layer, false, NULL, NULL, q, out);
	r = kvq_cpu_attention(&a, t->t, t->nseq, q, out);
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
