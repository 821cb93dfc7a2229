/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq_format.h"
#include "mm.h"
#include "model.h"
#ifdef KVQ_WITH_CUDA
#include "model_gpu.h"
#endif

struct model {
	struct model_cfg cfg;
	const struct gguf_tensor *embd, *out_norm, *out;
	struct layer_w *lw;
	struct model_opts opt;
#ifdef KVQ_WITH_CUDA
	gpu_fwd *gpu;
#endif
	struct model_times t;
	/* scratch for max_batch rows: activations, each row's position, the
	 * rows whose logits a step returns */
	float *x, *xn, *q, *k, *v, *att, *tmp, *g, *u;
	uint16_t *k16, *v16;
	uint32_t *pos, *out_rows;
	float *greedy;          /* model_step_greedy's logits on the CPU path */
	uint32_t greedy_rows;
};

static int cfg_u32(const gguf_file *f, const char *key, uint32_t *ret, char *err, size_t errlen)
{
	uint64_t v;

	if (gguf_get_uint(f, key, &v) < 0 || v == 0 || v > (1u << 20)) {
		snprintf(err, errlen, "model: %s missing or out of range", key);
		return -EINVAL;
	}
	*ret = (uint32_t)v;
	return 0;
}

/* The tensor name with shape {ne0, ne1} (ne1 0: a vector of ne0). */
static const struct gguf_tensor *want(const gguf_file *f, const char *name, uint32_t ne0, uint32_t ne1,
				      int *bad, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_tensor(f, name);

	if (!t || t->ne[0] != ne0 || t->rows != (ne1 ? ne1 : 1) || (!ne1 && t->type != GGUF_T_F32)) {
		if (!*bad)
			snprintf(err, errlen, "model: tensor %s %s", name, t ? "has an unexpected shape or type" : "missing");
		*bad = 1;
		return NULL;
	}
	return t;
}

int model_read_cfg(const gguf_file *f, struct model_cfg *c, char *err, size_t errlen)
{
	const struct gguf_tensor *embd;
	struct gguf_str arch;
	int r;

	if (gguf_get_str(f, "general.architecture", &arch) < 0 || arch.len != 5 || memcmp(arch.p, "llama", 5)) {
		snprintf(err, errlen, "model: not a llama-architecture file");
		return -EINVAL;
	}
	if ((r = cfg_u32(f, "llama.block_count", &c->layers, err, errlen)) < 0 ||
	    (r = cfg_u32(f, "llama.embedding_length", &c->dim, err, errlen)) < 0 ||
	    (r = cfg_u32(f, "llama.attention.head_count", &c->heads, err, errlen)) < 0 ||
	    (r = cfg_u32(f, "llama.attention.head_count_kv", &c->kv_heads, err, errlen)) < 0 ||
	    (r = cfg_u32(f, "llama.feed_forward_length", &c->ffn, err, errlen)) < 0 ||
	    (r = cfg_u32(f, "llama.context_length", &c->ctx, err, errlen)) < 0)
		return r;
	c->eps = 1e-5f;
	c->rope_base = 10000.0f;
	gguf_get_float(f, "llama.attention.layer_norm_rms_epsilon", &c->eps);
	gguf_get_float(f, "llama.rope.freq_base", &c->rope_base);
	if (c->dim % c->heads || c->heads % c->kv_heads || (c->dim / c->heads) % 16) {
		snprintf(err, errlen, "model: unsupported head geometry");
		return -EINVAL;
	}
	c->head_dim = c->dim / c->heads;
	embd = gguf_tensor(f, "token_embd.weight");
	if (!embd || embd->ne[0] != c->dim) {
		snprintf(err, errlen, "model: no token_embd.weight");
		return -EINVAL;
	}
	c->vocab = (uint32_t)embd->rows;
	return 0;
}

int model_load(const gguf_file *f, const struct model_opts *opts, model **ret_model, char *err, size_t errlen)
{
	const uint32_t max_batch = opts->max_batch;
	struct model_cfg *c;
	model *m;
	int bad = 0, r;
	size_t n;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	c = &m->cfg;
	if ((r = model_read_cfg(f, c, err, errlen)) < 0)
		goto fail;
	r = -EINVAL;
	m->embd = gguf_tensor(f, "token_embd.weight");
	m->out_norm = want(f, "output_norm.weight", c->dim, 0, &bad, err, errlen);
	/* tied embeddings when the file has no output.weight */
	m->out = gguf_tensor(f, "output.weight") ? want(f, "output.weight", c->dim, c->vocab, &bad, err, errlen)
						: m->embd;
	m->lw = calloc(c->layers, sizeof(*m->lw));
	if (!m->lw) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t l = 0; l < c->layers && !bad; l++) {
		struct layer_w *w = &m->lw[l];
		uint32_t kvd = c->kv_heads * c->head_dim;
		char name[96];

#define W(field, suffix, a, b) \
	(snprintf(name, sizeof(name), "blk.%u." suffix, l), w->field = want(f, name, a, b, &bad, err, errlen))
		W(attn_norm, "attn_norm.weight", c->dim, 0);
		W(q, "attn_q.weight", c->dim, c->dim);
		W(k, "attn_k.weight", c->dim, kvd);
		W(v, "attn_v.weight", c->dim, kvd);
		W(o, "attn_output.weight", c->dim, c->dim);
		W(ffn_norm, "ffn_norm.weight", c->dim, 0);
		W(gate, "ffn_gate.weight", c->dim, c->ffn);
		W(up, "ffn_up.weight", c->dim, c->ffn);
		W(down, "ffn_down.weight", c->ffn, c->dim);
#undef W
	}
	if (bad)
		goto fail;
	m->opt = *opts;
	if (opts->gpu >= 0 && (opts->k_sum || opts->kv_tap)) {
		snprintf(err, errlen, "model: K sums and K/V samples are taken on the CPU path only");
		goto fail;
	}
	if (opts->gpu >= 0) {
#ifdef KVQ_WITH_CUDA
		r = gpu_fwd_new(c, m->lw, m->out_norm, m->out, opts->k_center, max_batch, opts->gpu, opts->gpu_flags,
				&m->gpu, err, errlen);
		if (r < 0)
			goto fail;
#else
		snprintf(err, errlen, "model: this kvq-run was built without CUDA");
		r = -ENOTSUP;
		goto fail;
#endif
	}
	n = max_batch;
	r = -ENOMEM;
	if (!(m->x = malloc(n * c->dim * sizeof(float))) || !(m->xn = malloc(n * c->dim * sizeof(float))) ||
	    !(m->q = malloc(n * c->dim * sizeof(float))) || !(m->att = malloc(n * c->dim * sizeof(float))) ||
	    !(m->tmp = malloc(n * c->dim * sizeof(float))) ||
	    !(m->k = malloc(n * c->kv_heads * c->head_dim * sizeof(float))) ||
	    !(m->v = malloc(n * c->kv_heads * c->head_dim * sizeof(float))) ||
	    !(m->k16 = malloc(n * c->kv_heads * c->head_dim * sizeof(uint16_t))) ||
	    !(m->v16 = malloc(n * c->kv_heads * c->head_dim * sizeof(uint16_t))) ||
	    !(m->g = malloc(n * c->ffn * sizeof(float))) || !(m->u = malloc(n * c->ffn * sizeof(float))) ||
	    !(m->pos = malloc(n * sizeof(uint32_t))) || !(m->out_rows = malloc(n * sizeof(uint32_t))))
		goto fail;
	*ret_model = m;
	return 0;
fail:
	model_free(m);
	return r;
}

void model_free(model *m)
{
	if (!m)
		return;
#ifdef KVQ_WITH_CUDA
	gpu_fwd_free(m->gpu);
#endif
	free(m->lw);
	free(m->x);
	free(m->xn);
	free(m->q);
	free(m->k);
	free(m->v);
	free(m->att);
	free(m->tmp);
	free(m->g);
	free(m->u);
	free(m->k16);
	free(m->v16);
	free(m->pos);
	free(m->out_rows);
	free(m->greedy);
	free(m);
}

const struct model_cfg *model_cfg(const model *m)
{
	return &m->cfg;
}

void *model_stream(const model *m)
{
#ifdef KVQ_WITH_CUDA
	if (m->gpu)
		return gpu_fwd_stream(m->gpu);
#endif
	return NULL;
}

const char *model_error(const model *m)
{
#ifdef KVQ_WITH_CUDA
	if (m->gpu && gpu_fwd_error(m->gpu)[0])
		return gpu_fwd_error(m->gpu);
#else
	(void)m;
#endif
	return NULL;
}

static void rmsnorm(const float *x, const float *w, uint32_t n, uint32_t dim, float eps, float *out)
{
	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * dim;
		double ss = 0;
		float sc;

		for (uint32_t i = 0; i < dim; i++)
			ss += (double)xt[i] * xt[i];
		sc = 1.0f / sqrtf((float)(ss / dim) + eps);
		for (uint32_t i = 0; i < dim; i++)
			out[(size_t)t * dim + i] = xt[i] * sc * w[i];
	}
}

/* RoPE on adjacent pairs (GGUF's llama files permute Q and K rows for it):
 * pair i of row t's head turns by pos[t] * base^(-2i/head_dim). */
static void rope(float *x, uint32_t n, uint32_t heads, uint32_t hd, const uint32_t *pos, float base)
{
	float step = powf(base, -2.0f / (float)hd);

	for (uint32_t t = 0; t < n; t++) {
		float theta = (float)pos[t];

		for (uint32_t i = 0; i < hd / 2; i++, theta *= step) {
			float cs = cosf(theta), sn = sinf(theta);

			for (uint32_t h = 0; h < heads; h++) {
				float *p = x + ((size_t)t * heads + h) * hd + 2 * i, a = p[0], b = p[1];

				p[0] = a * cs - b * sn;
				p[1] = a * sn + b * cs;
			}
		}
	}
}

static double clock_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One layer's K/V write and attention for the step's n rows (q in m->q,
 * out to m->att), timed. */
static int cpu_attention(model *m, kvq_batch *b, uint32_t l)
{
	double t0 = clock_s(), t1;
	int r = kvq_batch_write(b, l, m->k16, m->v16);

	t1 = clock_s();
	m->t.write += t1 - t0;
	if (r == 0)
		r = kvq_batch_attention(b, l, m->cfg.heads, 0.0f, m->q, m->att);
	m->t.attention += clock_s() - t1;
	return r;
}

/* The layers on the CPU for the n rows whose embeddings are in m->x and
 * positions in m->pos. */
static int cpu_layers(model *m, kvq_batch *b, uint32_t n)
{
	const struct model_cfg *c = &m->cfg;
	const uint32_t D = c->dim, kvd = c->kv_heads * c->head_dim;
	int r;

	for (uint32_t l = 0; l < c->layers; l++) {
		const struct layer_w *w = &m->lw[l];

		rmsnorm(m->x, (const float *)w->attn_norm->data, n, D, c->eps, m->xn);
		mm_matmul(w->q, m->xn, n, m->q);
		mm_matmul(w->k, m->xn, n, m->k);
		mm_matmul(w->v, m->xn, n, m->v);
		rope(m->q, n, c->heads, c->head_dim, m->pos, c->rope_base);
		rope(m->k, n, c->kv_heads, c->head_dim, m->pos, c->rope_base);
		if (m->opt.k_center)
			for (uint32_t t = 0; t < n; t++)
				for (uint32_t j = 0; j < kvd; j++)
					m->k[(size_t)t * kvd + j] -= m->opt.k_center[(size_t)l * kvd + j];
		if (m->opt.k_sum)
			for (uint32_t t = 0; t < n; t++)
				for (uint32_t j = 0; j < kvd; j++)
					m->opt.k_sum[(size_t)l * kvd + j] += m->k[(size_t)t * kvd + j];
		for (size_t i = 0; i < (size_t)n * kvd; i++) {
			m->k16[i] = kvq_f16_from_f32(m->k[i]);
			m->v16[i] = kvq_f16_from_f32(m->v[i]);
		}
		if (m->opt.kv_tap)
			m->opt.kv_tap(m->opt.kv_tap_arg, l, n, m->k16, m->v16);
		if ((r = cpu_attention(m, b, l)) < 0)
			return r;
		mm_matmul(w->o, m->att, n, m->tmp);
		for (size_t i = 0; i < (size_t)n * D; i++)
			m->x[i] += m->tmp[i];
		rmsnorm(m->x, (const float *)w->ffn_norm->data, n, D, c->eps, m->xn);
		mm_matmul(w->gate, m->xn, n, m->g);
		mm_matmul(w->up, m->xn, n, m->u);
		for (size_t i = 0; i < (size_t)n * c->ffn; i++)
			m->g[i] = m->g[i] / (1.0f + expf(-m->g[i])) * m->u[i];
		mm_matmul(w->down, m->g, n, m->tmp);
		for (size_t i = 0; i < (size_t)n * D; i++)
			m->x[i] += m->tmp[i];
	}
	return 0;
}

/* Next-token logits of the n_out rows of m->x listed in m->out_rows, as
 * one product. */
static void cpu_logits(model *m, uint32_t n_out, float *logits)
{
	const struct model_cfg *c = &m->cfg;

	for (uint32_t j = 0; j < n_out; j++)
		rmsnorm(m->x + (size_t)m->out_rows[j] * c->dim, (const float *)m->out_norm->data, 1, c->dim, c->eps,
			m->xn + (size_t)j * c->dim);
	mm_matmul(m->out, m->xn, n_out, logits);
}

/* The step's rows: each sequence's embeddings into m->x, positions into
 * m->pos, the rows whose logits are wanted into m->out_rows.  Returns 0
 * and the counts, or -EINVAL (bad counts, a token past the vocabulary). */
static int step_rows(model *m, const struct model_seq *seq, uint32_t nseq, uint32_t *ret_rows,
		     uint32_t *ret_out)
{
	const struct model_cfg *c = &m->cfg;
	uint32_t rows = 0, n_out = 0;

	for (uint32_t i = 0; i < nseq; i++) {
		const struct model_seq *q = &seq[i];
		uint32_t pos0 = kvq_seq_tokens(q->s);

		if (q->n == 0 || q->n > m->opt.max_batch - rows || q->n_out > q->n)
			return -EINVAL;
		for (uint32_t t = 0; t < q->n; t++, rows++) {
			if (q->tokens[t] >= c->vocab)
				return -EINVAL;
			mm_dequant_row(m->embd->type, m->embd->data + (size_t)q->tokens[t] * m->embd->row_bytes, c->dim,
				       m->x + (size_t)rows * c->dim);
			m->pos[rows] = pos0 + t;
			if (t >= q->n - q->n_out)
				m->out_rows[n_out++] = rows;
		}
	}
	*ret_rows = rows;
	*ret_out = n_out;
	return 0;
}

/* The step's sequences into b, and its begin; the rows must be those
 * step_rows counted (no lookup on the way). */
static int step_begin(kvq_batch *b, const struct model_seq *seq, uint32_t nseq, uint32_t rows)
{
	const uint32_t *ip;
	uint32_t got;
	int r;

	for (uint32_t i = 0; i < nseq; i++)
		if ((r = kvq_batch_add(b, seq[i].s, seq[i].tokens, seq[i].n, 0)) < 0)
			return r;
	if ((r = kvq_batch_begin(b, NULL)) < 0)
		return r;
	ip = kvq_batch_indptr(b, &got);
	if (!ip || got != nseq || ip[nseq] != rows) {
		kvq_batch_abort(b);
		return -EPROTO;
	}
	return 0;
}

static int layers(model *m, kvq_batch *b, uint32_t rows)
{
#ifdef KVQ_WITH_CUDA
	if (m->gpu) {
		int r = gpu_fwd_layers(m->gpu, b, m->x, rows, m->pos);

		gpu_fwd_times(m->gpu, &m->t.write, &m->t.attention, &m->t.span);
		return r;
	}
#endif
	return cpu_layers(m, b, rows);
}

/* The step up to its output: embeddings, begin, layers (their times in
 * m->t).  *ret_out gets the count of rows whose logits are wanted
 * (m->out_rows).  On failure the step is abandoned and b cleared. */
static int step_layers(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, uint32_t *ret_out)
{
	uint32_t rows;
	double t = clock_s(), t1;
	int r;

	if (nseq == 0)
		return -EINVAL;
	if ((r = step_rows(m, seq, nseq, &rows, ret_out)) < 0)
		return r;
	t1 = clock_s();
	m->t.rows = t1 - t;
	r = step_begin(b, seq, nseq, rows);
	t = clock_s();
	m->t.begin = t - t1;
	if (r < 0) {
		kvq_batch_clear(b);
		return r;
	}
	r = layers(m, b, rows);
	m->t.layers = clock_s() - t;
	if (r < 0) {
		kvq_batch_abort(b);
		kvq_batch_clear(b);
	}
	return r;
}

/* The step's commit, b cleared after. */
static int step_commit(model *m, kvq_batch *b)
{
	double t = clock_s();
	int r = kvq_batch_commit(b);

	kvq_batch_clear(b);
	m->t.commit = clock_s() - t;
	return r;
}

/* The first of equal maxima, as kvq-run's argmax(). */
static uint32_t row_argmax(const float *x, uint32_t n)
{
	uint32_t b = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* The greedy choices of the n_out rows, from logits in m->greedy (grown to
 * the most rows a step asked for). */
static int cpu_greedy(model *m, uint32_t n_out, uint32_t *ids)
{
	const uint32_t V = m->cfg.vocab;

	if (n_out > m->greedy_rows) {
		float *p = realloc(m->greedy, (size_t)n_out * V * sizeof(float));

		if (!p)
			return -ENOMEM;
		m->greedy = p;
		m->greedy_rows = n_out;
	}
	cpu_logits(m, n_out, m->greedy);
	for (uint32_t j = 0; j < n_out; j++)
		ids[j] = row_argmax(m->greedy + (size_t)j * V, V);
	return 0;
}

/* A step and its output rows: their logits (logits) or their greedy
 * tokens (ids), whichever is not NULL. */
static int step_out(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, float *logits,
		    uint32_t *ids)
{
	double t0 = clock_s(), t;
	uint32_t n_out;
	int r;

	m->t = (struct model_times){ 0 };
	if ((r = step_layers(m, b, seq, nseq, &n_out)) < 0 || (r = step_commit(m, b)) < 0)
		goto out;
	t = clock_s();
	if (n_out) {
#ifdef KVQ_WITH_CUDA
		if (m->gpu)
			r = logits ? gpu_fwd_logits(m->gpu, m->out_rows, n_out, logits)
				   : gpu_fwd_greedy(m->gpu, m->out_rows, n_out, ids);
		else
#endif
		if (logits)
			cpu_logits(m, n_out, logits);
		else
			r = cpu_greedy(m, n_out, ids);
	}
	m->t.out = clock_s() - t;
out:
	m->t.step = clock_s() - t0;
	return r;
}

int model_step(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, float *logits)
{
	return step_out(m, b, seq, nseq, logits, NULL);
}

int model_step_greedy(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, uint32_t *ids)
{
	return step_out(m, b, seq, nseq, NULL, ids);
}

const struct model_times *model_times(const model *m)
{
	return &m->t;
}
