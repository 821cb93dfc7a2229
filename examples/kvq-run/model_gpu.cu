/* SPDX-License-Identifier: Apache-2.0 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>   /* types only: the library is opened at run time */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "mm.h"
#include "model.h"
}
#include "model_gpu.h"

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {

struct cublas_api {
	void *lib;
	cublasStatus_t (*create)(cublasHandle_t *);
	cublasStatus_t (*destroy)(cublasHandle_t);
	cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
	cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
				const float *, const float *, int, const float *, int, const float *, float *, int);
};

struct dev_layer {
	float *attn_norm, *q, *k, *v, *o, *ffn_norm, *gate, *up, *down;
};

/* rows x cols weight (GGUF: cols = ne[0], the input side) */
struct dev_w {
	const float *p;
	uint32_t rows, cols;
};

} // namespace

struct gpu_fwd {
	struct model_cfg c;
	uint32_t max_batch;
	cublas_api cb;
	cublasHandle_t h;
	dev_layer *lw;
	uint32_t n_lw;
	float *out_norm, *out;
	uint32_t out_rows;
	float *k_center;        /* [layers][kvd] or NULL */
	/* scratch for max_batch rows; pos: each row's position, rows: the rows
	 * whose logits are wanted */
	float *x, *xn, *q, *k, *v, *att, *g, *u, *logits;
	__half *q16, *k16, *v16;
	uint32_t *pos, *rows, *ids;
	/* per layer: before the K/V write, between it and attention, after */
	cudaEvent_t *ev;
	double t_write, t_attention;
	char err[256];
};

static int gfail(gpu_fwd *g, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g->err, sizeof(g->err), fmt, ap);
	va_end(ap);
	return code;
}

static int cuda_ok(gpu_fwd *g, cudaError_t e, const char *what)
{
	return e == cudaSuccess ? 0 : gfail(g, -EIO, "%s: %s", what, cudaGetErrorString(e));
}

/* ------------------------------------------------------------- kernels */

/* One CTA per row (row rows[i] of x for CTA i where rows is given); sum of
 * squares in double as on the CPU path. */
__global__ void k_rmsnorm(const float *x, const uint32_t *rows, const float *w, uint32_t dim, float eps, float *out)
{
	__shared__ double part[32];
	const float *xt = x + (size_t)(rows ? rows[blockIdx.x] : blockIdx.x) * dim;
	float *ot = out + (size_t)blockIdx.x * dim;
	double ss = 0;
	float sc;

	for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
		ss += (double)xt[i] * xt[i];
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		ss = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
		for (int o = 16; o; o >>= 1)
			ss += __shfl_xor_sync(0xffffffffu, ss, o);
		if (threadIdx.x == 0)
			part[0] = ss;
	}
	__syncthreads();
	sc = 1.0f / sqrtf((float)(part[0] / dim) + eps);
	for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
		ot[i] = xt[i] * sc * w[i];
}

/* RoPE on adjacent pairs, row t at position pos[t], the angle built as the
 * CPU path builds it (pos * step^i by repeated products; step computed on
 * the host). */
__global__ void k_rope(float *x, uint32_t n, uint32_t heads, uint32_t hd, const uint32_t *pos, float step)
{
	uint32_t half = hd / 2, id = blockIdx.x * blockDim.x + threadIdx.x;

	if (id >= n * heads * half)
		return;
	uint32_t i = id % half, h = id / half % heads, t = id / half / heads;
	float theta = (float)pos[t];

	for (uint32_t j = 0; j < i; j++)
		theta *= step;
	float cs = cosf(theta), sn = sinf(theta);
	float *p = x + ((size_t)t * heads + h) * hd + 2 * i, a = p[0], b = p[1];

	p[0] = a * cs - b * sn;
	p[1] = a * sn + b * cs;
}

/* x[t][j] -= c[j] for n rows of w */
__global__ void k_sub_rows(float *x, const float *c, uint32_t n, uint32_t w)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i < (size_t)n * w)
		x[i] -= c[i % w];
}

__global__ void k_to_half(const float *x, size_t n, __half *y)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		y[i] = __float2half_rn(x[i]);
}

__global__ void k_swiglu(float *gate, const float *up, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* Whether (v, i) beats (bv, bi): the larger value, the first index of equal
 * ones, as the CPU's argmax takes. */
__device__ static bool beats(float v, uint32_t i, float bv, uint32_t bi)
{
	return v > bv || (v == bv && i < bi);
}

/* One CTA of 256 threads per row of x ([rows][n]): ids[row] = its argmax. */
__global__ void k_argmax(const float *x, uint32_t n, uint32_t *ids)
{
	__shared__ float sv[256];
	__shared__ uint32_t si[256];
	const float *xr = x + (size_t)blockIdx.x * n;
	float bv = xr[0];
	uint32_t bi = 0;

	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		if (beats(xr[i], i, bv, bi)) {
			bv = xr[i];
			bi = i;
		}
	sv[threadIdx.x] = bv;
	si[threadIdx.x] = bi;
	__syncthreads();
	for (uint32_t s = blockDim.x / 2; s; s >>= 1) {
		if (threadIdx.x < s && beats(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
			sv[threadIdx.x] = sv[threadIdx.x + s];
			si[threadIdx.x] = si[threadIdx.x + s];
		}
		__syncthreads();
	}
	if (threadIdx.x == 0)
		ids[blockIdx.x] = si[0];
}

static unsigned blocks(size_t n, unsigned per)
{
	return (unsigned)((n + per - 1) / per);
}

/* ----------------------------------------------------------- the model */

static int open_cublas(gpu_fwd *g)
{
	static const char *const names[] = { "libcublas.so." STR(CUBLAS_VER_MAJOR), "libcublas.so" };
	cublas_api *a = &g->cb;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !a->lib; i++)
		a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!a->lib)
		return gfail(g, -ENODEV, "cuBLAS not found (%s): add its directory to LD_LIBRARY_PATH", names[0]);
	*(void **)&a->create = dlsym(a->lib, "cublasCreate_v2");
	*(void **)&a->destroy = dlsym(a->lib, "cublasDestroy_v2");
	*(void **)&a->set_math_mode = dlsym(a->lib, "cublasSetMathMode");
	*(void **)&a->sgemm = dlsym(a->lib, "cublasSgemm_v2");
	if (!a->create || !a->destroy || !a->set_math_mode || !a->sgemm)
		return gfail(g, -ENODEV, "cuBLAS lacks cublasSgemm_v2 and friends");
	if (a->create(&g->h) != CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasCreate failed");
	/* plain FP32 products (no TF32): the GPU path should compute what the
	 * CPU path computes */
	if (a->set_math_mode(g->h, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasSetMathMode failed");
	return 0;
}

/* The tensor dequantized to f32 in device memory. */
static int upload(gpu_fwd *g, const struct gguf_tensor *t, float **ret)
{
	size_t cols = t->ne[0], rows = t->rows;
	float *h = (float *)malloc(rows * cols * sizeof(float));
	int r;

	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < rows; i++)
		mm_dequant_row(t->type, t->data + i * t->row_bytes, (uint32_t)cols, h + i * cols);
	r = cuda_ok(g, cudaMalloc((void **)ret, rows * cols * sizeof(float)), "cudaMalloc (weights)");
	if (r == 0)
		r = cuda_ok(g, cudaMemcpy(*ret, h, rows * cols * sizeof(float), cudaMemcpyHostToDevice),
			    "copying weights");
	free(h);
	return r;
}

int gpu_fwd_new(const struct model_cfg *cfg, const struct layer_w *lw, const struct gguf_tensor *out_norm,
		const struct gguf_tensor *out, const float *k_center, uint32_t max_batch, int dev, gpu_fwd **ret,
		char *err, size_t errlen)
{
	gpu_fwd *g = (gpu_fwd *)calloc(1, sizeof(*g));
	const size_t n = max_batch, D = cfg->dim, kvd = (size_t)cfg->kv_heads * cfg->head_dim;
	int r;

	if (!g)
		return -ENOMEM;
	g->c = *cfg;
	g->max_batch = max_batch;
	if ((r = cuda_ok(g, cudaSetDevice(dev), "cudaSetDevice")) < 0 || (r = open_cublas(g)) < 0)
		goto fail;
	r = -ENOMEM;
	g->lw = (dev_layer *)calloc(cfg->layers, sizeof(*g->lw));
	if (!g->lw)
		goto fail;
	g->n_lw = cfg->layers;
	for (uint32_t l = 0; l < cfg->layers; l++) {
		const struct layer_w *w = &lw[l];
		dev_layer *d = &g->lw[l];

		if ((r = upload(g, w->attn_norm, &d->attn_norm)) < 0 || (r = upload(g, w->q, &d->q)) < 0 ||
		    (r = upload(g, w->k, &d->k)) < 0 || (r = upload(g, w->v, &d->v)) < 0 ||
		    (r = upload(g, w->o, &d->o)) < 0 || (r = upload(g, w->ffn_norm, &d->ffn_norm)) < 0 ||
		    (r = upload(g, w->gate, &d->gate)) < 0 || (r = upload(g, w->up, &d->up)) < 0 ||
		    (r = upload(g, w->down, &d->down)) < 0)
			goto fail;
	}
	if ((r = upload(g, out_norm, &g->out_norm)) < 0 || (r = upload(g, out, &g->out)) < 0)
		goto fail;
	g->out_rows = (uint32_t)out->rows;
	if (k_center) {
		size_t bytes = cfg->layers * kvd * sizeof(float);

		if ((r = cuda_ok(g, cudaMalloc((void **)&g->k_center, bytes), "cudaMalloc (K centers)")) < 0 ||
		    (r = cuda_ok(g, cudaMemcpy(g->k_center, k_center, bytes, cudaMemcpyHostToDevice), "copying K centers")) < 0)
			goto fail;
	}
	{
		struct {
			void **p;
			size_t bytes;
		} s[] = { { (void **)&g->x, n * D * 4 }, { (void **)&g->xn, n * D * 4 }, { (void **)&g->q, n * D * 4 },
			  { (void **)&g->att, n * D * 4 }, { (void **)&g->k, n * kvd * 4 }, { (void **)&g->v, n * kvd * 4 },
			  { (void **)&g->g, n * cfg->ffn * 4 }, { (void **)&g->u, n * cfg->ffn * 4 },
			  { (void **)&g->logits, n * (size_t)cfg->vocab * 4 }, { (void **)&g->q16, n * D * 2 },
			  { (void **)&g->k16, n * kvd * 2 }, { (void **)&g->v16, n * kvd * 2 },
			  { (void **)&g->pos, n * 4 }, { (void **)&g->rows, n * 4 }, { (void **)&g->ids, n * 4 } };

		for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
			if ((r = cuda_ok(g, cudaMalloc(s[i].p, s[i].bytes), "cudaMalloc (buffers)")) < 0)
				goto fail;
	}
	if (!(g->ev = (cudaEvent_t *)calloc(3 * (size_t)cfg->layers, sizeof(*g->ev)))) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < 3 * cfg->layers; i++)
		if ((r = cuda_ok(g, cudaEventCreate(&g->ev[i]), "cudaEventCreate")) < 0)
			goto fail;
	*ret = g;
	return 0;
fail:
	snprintf(err, errlen, "gpu: %s", g->err[0] ? g->err : strerror(-r));
	gpu_fwd_free(g);
	return r;
}

void gpu_fwd_free(gpu_fwd *g)
{
	if (!g)
		return;
	for (uint32_t l = 0; g->lw && l < g->n_lw; l++) {
		dev_layer *d = &g->lw[l];
		float *p[] = { d->attn_norm, d->q, d->k, d->v, d->o, d->ffn_norm, d->gate, d->up, d->down };

		for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
			cudaFree(p[i]);
	}
	free(g->lw);
	void *b[] = { g->k_center, g->out_norm, g->out, g->x, g->xn, g->q, g->k, g->v, g->att, g->g, g->u, g->logits,
		      g->q16, g->k16, g->v16, g->pos, g->rows, g->ids };
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
		cudaFree(b[i]);
	for (uint32_t i = 0; g->ev && i < 3 * g->n_lw; i++)
		if (g->ev[i])
			cudaEventDestroy(g->ev[i]);
	free(g->ev);
	if (g->h)
		g->cb.destroy(g->h);
	if (g->cb.lib)
		dlclose(g->cb.lib);
	free(g);
}

const char *gpu_fwd_error(const gpu_fwd *g)
{
	return g->err;
}

/* y[t][r] = dot(row r of W, x[t]) (+ y[t][r] when acc): column-major,
 * W^T (rows x cols) times x (cols x T). */
static int gemm(gpu_fwd *g, const float *W, uint32_t rows, uint32_t cols, const float *x, uint32_t T, float *y,
		bool acc)
{
	const float one = 1.0f, zero = 0.0f;

	if (g->cb.sgemm(g->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)cols, &one, W, (int)cols, x, (int)cols,
			acc ? &one : &zero, y, (int)rows) != CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasSgemm failed");
	return 0;
}

/* One layer's K/V write and attention for the step's n rows of b (q16 in,
 * att out), between event pairs. */
static int kv_attention(gpu_fwd *g, kvq_batch *b, uint32_t l)
{
	cudaEvent_t *e = g->ev + 3 * (size_t)l;
	int r;

	if ((r = cuda_ok(g, cudaEventRecord(e[0], 0), "cudaEventRecord")) < 0)
		return r;
	if ((r = kvq_batch_write(b, l, g->k16, g->v16)) < 0 ||
	    (r = cuda_ok(g, cudaEventRecord(e[1], 0), "cudaEventRecord")) < 0)
		return r;
	if ((r = kvq_batch_attention_device(b, l, g->c.heads, 0.0f, g->q16, g->att, 1)) < 0)
		return r;
	return cuda_ok(g, cudaEventRecord(e[2], 0), "cudaEventRecord");
}

/* The event pairs of the last step's layers, summed (waits for the last). */
static int sum_events(gpu_fwd *g)
{
	float w, a;
	int r;

	g->t_write = g->t_attention = 0;
	if ((r = cuda_ok(g, cudaEventSynchronize(g->ev[3 * (size_t)g->n_lw - 1]), "waiting for the step")) < 0)
		return r;
	for (uint32_t l = 0; l < g->n_lw; l++) {
		cudaEvent_t *e = g->ev + 3 * (size_t)l;

		if ((r = cuda_ok(g, cudaEventElapsedTime(&w, e[0], e[1]), "cudaEventElapsedTime")) < 0 ||
		    (r = cuda_ok(g, cudaEventElapsedTime(&a, e[1], e[2]), "cudaEventElapsedTime")) < 0)
			return r;
		g->t_write += w / 1e3;
		g->t_attention += a / 1e3;
	}
	return 0;
}

int gpu_fwd_layers(gpu_fwd *g, kvq_batch *b, const float *x, uint32_t n, const uint32_t *pos)
{
	const struct model_cfg *c = &g->c;
	const uint32_t D = c->dim, hd = c->head_dim, kvd = c->kv_heads * hd;
	const float step = powf(c->rope_base, -2.0f / (float)hd);
	int r;

	g->err[0] = 0;
	if (n == 0 || n > g->max_batch)
		return gfail(g, -EINVAL, "bad row count");
	if ((r = cuda_ok(g, cudaMemcpy(g->x, x, (size_t)n * D * 4, cudaMemcpyHostToDevice), "copying embeddings")) < 0 ||
	    (r = cuda_ok(g, cudaMemcpy(g->pos, pos, (size_t)n * 4, cudaMemcpyHostToDevice), "copying positions")) < 0)
		return r;
	for (uint32_t l = 0; l < c->layers; l++) {
		const dev_layer *w = &g->lw[l];

		k_rmsnorm<<<n, 256>>>(g->x, NULL, w->attn_norm, D, c->eps, g->xn);
		if ((r = gemm(g, w->q, D, D, g->xn, n, g->q, false)) < 0 ||
		    (r = gemm(g, w->k, kvd, D, g->xn, n, g->k, false)) < 0 ||
		    (r = gemm(g, w->v, kvd, D, g->xn, n, g->v, false)) < 0)
			return r;
		k_rope<<<blocks((size_t)n * c->heads * hd / 2, 256), 256>>>(g->q, n, c->heads, hd, g->pos, step);
		k_rope<<<blocks((size_t)n * c->kv_heads * hd / 2, 256), 256>>>(g->k, n, c->kv_heads, hd, g->pos, step);
		if (g->k_center)
			k_sub_rows<<<blocks((size_t)n * kvd, 256), 256>>>(g->k, g->k_center + (size_t)l * kvd, n, kvd);
		k_to_half<<<blocks((size_t)n * D, 256), 256>>>(g->q, (size_t)n * D, g->q16);
		k_to_half<<<blocks((size_t)n * kvd, 256), 256>>>(g->k, (size_t)n * kvd, g->k16);
		k_to_half<<<blocks((size_t)n * kvd, 256), 256>>>(g->v, (size_t)n * kvd, g->v16);
		if ((r = cuda_ok(g, cudaGetLastError(), "a kernel launch")) < 0)
			return r;
		if ((r = kv_attention(g, b, l)) < 0)
			return r;   /* libkvq's leave g->err empty: kvq_client_error names them */
		if ((r = gemm(g, w->o, D, D, g->att, n, g->x, true)) < 0)
			return r;
		k_rmsnorm<<<n, 256>>>(g->x, NULL, w->ffn_norm, D, c->eps, g->xn);
		if ((r = gemm(g, w->gate, c->ffn, D, g->xn, n, g->g, false)) < 0 ||
		    (r = gemm(g, w->up, c->ffn, D, g->xn, n, g->u, false)) < 0)
			return r;
		k_swiglu<<<blocks((size_t)n * c->ffn, 256), 256>>>(g->g, g->u, (size_t)n * c->ffn);
		if ((r = gemm(g, w->down, D, c->ffn, g->g, n, g->x, true)) < 0)
			return r;
	}
	if ((r = cuda_ok(g, cudaGetLastError(), "a kernel launch")) < 0)
		return r;
	return sum_events(g);
}

void gpu_fwd_times(const gpu_fwd *g, double *ret_write, double *ret_attention)
{
	*ret_write = g->t_write;
	*ret_attention = g->t_attention;
}

/* The logits of rows[0..n_out) of the last layers into g->logits. */
static int out_logits(gpu_fwd *g, const uint32_t *rows, uint32_t n_out)
{
	const struct model_cfg *c = &g->c;
	int r;

	if (n_out == 0 || n_out > g->max_batch)
		return gfail(g, -EINVAL, "bad row count");
	if ((r = cuda_ok(g, cudaMemcpy(g->rows, rows, (size_t)n_out * 4, cudaMemcpyHostToDevice), "copying rows")) < 0)
		return r;
	k_rmsnorm<<<n_out, 256>>>(g->x, g->rows, g->out_norm, c->dim, c->eps, g->xn);
	return gemm(g, g->out, g->out_rows, c->dim, g->xn, n_out, g->logits, false);
}

int gpu_fwd_logits(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, float *logits)
{
	int r = out_logits(g, rows, n_out);

	if (r < 0)
		return r;
	return cuda_ok(g, cudaMemcpy(logits, g->logits, (size_t)n_out * g->out_rows * 4, cudaMemcpyDeviceToHost),
		       "copying logits");
}

int gpu_fwd_greedy(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, uint32_t *ids)
{
	int r = out_logits(g, rows, n_out);

	if (r < 0)
		return r;
	k_argmax<<<n_out, 256>>>(g->logits, g->out_rows, g->ids);
	if ((r = cuda_ok(g, cudaGetLastError(), "a kernel launch")) < 0)
		return r;
	return cuda_ok(g, cudaMemcpy(ids, g->ids, (size_t)n_out * 4, cudaMemcpyDeviceToHost), "copying token ids");
}
