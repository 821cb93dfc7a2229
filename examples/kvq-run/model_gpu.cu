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
	cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
	cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
				const float *, const float *, int, const float *, int, const float *, float *, int);
	cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
				  const void *, cudaDataType_t, int, const void *, cudaDataType_t, int, const void *,
				  void *, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t);
};

/* One layer's weights: q, k and v as one matrix (their rows in that
 * order), gate and up as one (gate's rows first); the norms' in f32, the
 * matrices' in f32, or in f16 with GPU_FWD_F16. */
struct dev_layer {
	float *attn_norm, *ffn_norm;
	void *qkv, *o, *gu, *down;
};

} // namespace

struct gpu_fwd {
	struct model_cfg c;
	uint32_t max_batch;
	bool f16;               /* GPU_FWD_F16: f16 weights, and f16 copies of the products' inputs */
	cublas_api cb;
	cublasHandle_t h;
	cudaStream_t s;         /* the model's work, and libkvq's when its client is told (kv.c) */
	dev_layer *lw;
	uint32_t n_lw;
	float *out_norm;
	void *out;
	uint32_t out_rows;
	float *k_center;        /* [layers][kvd] or NULL */
	/* scratch for max_batch rows; pos: each row's position, rows: the rows
	 * whose logits are wanted; qkv [rows][dim + 2 kvd], gu [rows][2 ffn] */
	float *x, *xn, *qkv, *att, *gu, *logits;
	__half *q16, *k16, *v16;
	/* GPU_FWD_F16: the products' inputs in f16 (xn, att, and SwiGLU's
	 * output [rows][ffn]) in place of the f32 ones */
	__half *xn16, *att16, *gu16;
	uint32_t *pos, *rows, *ids;
	/* the layers' stretches between libkvq's calls as CUDA graphs, for
	 * graph_n rows: graph[0] before layer 0's write, graph[l] from layer
	 * l - 1's attention to layer l's write, graph[layers] after the last */
	bool graphs;
	cudaGraphExec_t *graph;
	uint32_t graph_n;
	/* per layer: before the K/V write, between it and attention, after;
	 * and the layers' first and last */
	cudaEvent_t *ev, span[2];
	double t_write, t_attention, t_span;
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
 * squares in double as on the CPU path; out in f32 or f16 (T). */
template <typename T>
__global__ void k_rmsnorm(const float *x, const uint32_t *rows, const float *w, uint32_t dim, float eps, T *out)
{
	__shared__ double part[32];
	const float *xt = x + (size_t)(rows ? rows[blockIdx.x] : blockIdx.x) * dim;
	T *ot = out + (size_t)blockIdx.x * dim;
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
		ot[i] = (T)(xt[i] * sc * w[i]);
}

/* The step's q, k and v ([n][dim + 2 kvd] as one product gave them) made
 * ready for libkvq, one thread per adjacent pair of a row: RoPE on q's and
 * k's pairs (row t at position pos[t], the angle built as the CPU path
 * builds it: pos * step^i by repeated products, step computed on the
 * host), then kc (NULL or the layer's [kvd]) subtracted from k, and all
 * three rounded to FP16 into q16 [n][dim], k16 and v16 [n][kvd]. */
__global__ void k_qkv_ready(const float *qkv, uint32_t n, uint32_t dim, uint32_t kvd, uint32_t hd,
			    const uint32_t *pos, float step, const float *kc, __half *q16, __half *k16, __half *v16)
{
	const uint32_t w = dim + 2 * kvd, pairs = w / 2;
	const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (id >= (size_t)n * pairs)
		return;
	const uint32_t t = (uint32_t)(id / pairs), col = 2 * (uint32_t)(id % pairs);
	const float *p = qkv + (size_t)t * w + col;
	float a = p[0], b = p[1];

	if (col < dim + kvd) {   /* q or k: rotated */
		const uint32_t i = col % hd / 2;
		float theta = (float)pos[t];

		for (uint32_t j = 0; j < i; j++)
			theta *= step;
		const float cs = cosf(theta), sn = sinf(theta), ra = a * cs - b * sn, rb = a * sn + b * cs;

		a = ra;
		b = rb;
	}
	__half *y;
	if (col < dim) {
		y = q16 + (size_t)t * dim + col;
	} else if (col < dim + kvd) {
		const uint32_t j = col - dim;

		if (kc) {
			a -= kc[j];
			b -= kc[j + 1];
		}
		y = k16 + (size_t)t * kvd + j;
	} else {
		y = v16 + (size_t)t * kvd + (col - dim - kvd);
	}
	y[0] = __float2half_rn(a);
	y[1] = __float2half_rn(b);
}

/* silu(gate) * up over [n][2 ffn] rows (gate then up): in place over the
 * gate (out NULL), or into out [n][ffn] in f16. */
__global__ void k_swiglu(float *gu, uint32_t n, uint32_t ffn, __half *out)
{
	const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (id >= (size_t)n * ffn)
		return;
	float *g = gu + id / ffn * 2 * ffn + id % ffn;
	const float y = *g / (1.0f + expf(-*g)) * g[ffn];

	if (out)
		out[id] = __float2half_rn(y);
	else
		*g = y;
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

static int open_cublas(gpu_fwd *g, bool tf32)
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
	*(void **)&a->set_stream = dlsym(a->lib, "cublasSetStream_v2");
	*(void **)&a->sgemm = dlsym(a->lib, "cublasSgemm_v2");
	*(void **)&a->gemm_ex = dlsym(a->lib, "cublasGemmEx");
	if (!a->create || !a->destroy || !a->set_math_mode || !a->set_stream || !a->sgemm || !a->gemm_ex)
		return gfail(g, -ENODEV, "cuBLAS lacks cublasSgemm_v2, cublasGemmEx and friends");
	if (a->create(&g->h) != CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasCreate failed");
	if (a->set_stream(g->h, g->s) != CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasSetStream failed");
	/* plain FP32 products unless asked: the GPU path should compute what
	 * the CPU path computes; TF32 rounds each input to 10 mantissa bits;
	 * f16 products (GPU_FWD_F16) take tensor cores in the default mode */
	if (a->set_math_mode(g->h, g->f16 ? CUBLAS_DEFAULT_MATH : tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH) !=
	    CUBLAS_STATUS_SUCCESS)
		return gfail(g, -EIO, "cublasSetMathMode failed");
	return 0;
}

/* The tensors t[0..n) (the same columns) dequantized to f32 and stacked,
 * their rows in that order, in device memory: in f16 (rounded to nearest)
 * where half is set. */
static int upload(gpu_fwd *g, const struct gguf_tensor *const *t, size_t n, bool half, void **ret)
{
	const size_t cols = t[0]->ne[0], es = half ? sizeof(__half) : sizeof(float);
	size_t rows = 0, at = 0;
	float *h;
	int r;

	for (size_t i = 0; i < n; i++)
		rows += t[i]->rows;
	if (!(h = (float *)malloc(rows * cols * sizeof(float))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < t[i]->rows; j++, at++)
			mm_dequant_row(t[i]->type, t[i]->data + j * t[i]->row_bytes, (uint32_t)cols, h + at * cols);
	if (half) {   /* in place: each f16 lands on a float already read */
		__half *h16 = (__half *)h;
		for (size_t i = 0; i < rows * cols; i++)
			h16[i] = __float2half_rn(h[i]);
	}
	r = cuda_ok(g, cudaMalloc(ret, rows * cols * es), "cudaMalloc (weights)");
	if (r == 0)
		r = cuda_ok(g, cudaMemcpy(*ret, h, rows * cols * es, cudaMemcpyHostToDevice), "copying weights");
	free(h);
	return r;
}

/* A vector (a norm's weights): f32. */
static int upload_vec(gpu_fwd *g, const struct gguf_tensor *t, float **ret)
{
	return upload(g, &t, 1, false, (void **)ret);
}

static int upload_layer(gpu_fwd *g, const struct layer_w *w, dev_layer *d)
{
	const struct gguf_tensor *qkv[] = { w->q, w->k, w->v }, *gu[] = { w->gate, w->up };
	int r;

	if ((r = upload_vec(g, w->attn_norm, &d->attn_norm)) < 0 || (r = upload(g, qkv, 3, g->f16, &d->qkv)) < 0 ||
	    (r = upload(g, &w->o, 1, g->f16, &d->o)) < 0 || (r = upload_vec(g, w->ffn_norm, &d->ffn_norm)) < 0 ||
	    (r = upload(g, gu, 2, g->f16, &d->gu)) < 0 || (r = upload(g, &w->down, 1, g->f16, &d->down)) < 0)
		return r;
	return 0;
}

static int alloc_buffers(gpu_fwd *g)
{
	const struct model_cfg *c = &g->c;
	const size_t n = g->max_batch, D = c->dim, kvd = (size_t)c->kv_heads * c->head_dim;
	struct {
		void **p;
		size_t bytes;
	} s[] = { { (void **)&g->x, n * D * 4 }, { (void **)&g->xn, n * D * 4 }, { (void **)&g->att, n * D * 4 },
		  { (void **)&g->qkv, n * (D + 2 * kvd) * 4 }, { (void **)&g->gu, n * 2 * c->ffn * 4 },
		  { (void **)&g->logits, n * (size_t)c->vocab * 4 }, { (void **)&g->q16, n * D * 2 },
		  { (void **)&g->k16, n * kvd * 2 }, { (void **)&g->v16, n * kvd * 2 },
		  { (void **)&g->pos, n * 4 }, { (void **)&g->rows, n * 4 }, { (void **)&g->ids, n * 4 },
		  { (void **)&g->xn16, g->f16 ? n * D * 2 : 0 }, { (void **)&g->att16, g->f16 ? n * D * 2 : 0 },
		  { (void **)&g->gu16, g->f16 ? n * c->ffn * 2 : 0 } };
	int r;

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
		if (s[i].bytes && (r = cuda_ok(g, cudaMalloc(s[i].p, s[i].bytes), "cudaMalloc (buffers)")) < 0)
			return r;
	if (!(g->ev = (cudaEvent_t *)calloc(3 * (size_t)c->layers, sizeof(*g->ev))) ||
	    !(g->graph = (cudaGraphExec_t *)calloc(c->layers + 1, sizeof(*g->graph))))
		return -ENOMEM;
	for (uint32_t i = 0; i < 3 * c->layers; i++)
		if ((r = cuda_ok(g, cudaEventCreate(&g->ev[i]), "cudaEventCreate")) < 0)
			return r;
	for (int i = 0; i < 2; i++)
		if ((r = cuda_ok(g, cudaEventCreate(&g->span[i]), "cudaEventCreate")) < 0)
			return r;
	return 0;
}

int gpu_fwd_new(const struct model_cfg *cfg, const struct layer_w *lw, const struct gguf_tensor *out_norm,
		const struct gguf_tensor *out, const float *k_center, uint32_t max_batch, int dev, unsigned flags,
		gpu_fwd **ret, char *err, size_t errlen)
{
	gpu_fwd *g = (gpu_fwd *)calloc(1, sizeof(*g));
	const size_t kvd = (size_t)cfg->kv_heads * cfg->head_dim;
	int r;

	if (!g)
		return -ENOMEM;
	g->c = *cfg;
	g->max_batch = max_batch;
	g->graphs = !(flags & GPU_FWD_NO_GRAPHS);
	g->f16 = flags & GPU_FWD_F16;
	/* a blocking stream: in order with libkvq's work on the legacy one */
	if ((r = cuda_ok(g, cudaSetDevice(dev), "cudaSetDevice")) < 0 ||
	    (r = cuda_ok(g, cudaStreamCreate(&g->s), "cudaStreamCreate")) < 0 ||
	    (r = open_cublas(g, flags & GPU_FWD_TF32)) < 0)
		goto fail;
	r = -ENOMEM;
	g->lw = (dev_layer *)calloc(cfg->layers, sizeof(*g->lw));
	if (!g->lw)
		goto fail;
	g->n_lw = cfg->layers;
	for (uint32_t l = 0; l < cfg->layers; l++)
		if ((r = upload_layer(g, &lw[l], &g->lw[l])) < 0)
			goto fail;
	if ((r = upload_vec(g, out_norm, &g->out_norm)) < 0 || (r = upload(g, &out, 1, g->f16, &g->out)) < 0)
		goto fail;
	g->out_rows = (uint32_t)out->rows;
	if (k_center) {
		size_t bytes = cfg->layers * kvd * sizeof(float);

		if ((r = cuda_ok(g, cudaMalloc((void **)&g->k_center, bytes), "cudaMalloc (K centers)")) < 0 ||
		    (r = cuda_ok(g, cudaMemcpy(g->k_center, k_center, bytes, cudaMemcpyHostToDevice), "copying K centers")) < 0)
			goto fail;
	}
	if ((r = alloc_buffers(g)) < 0)
		goto fail;
	*ret = g;
	return 0;
fail:
	snprintf(err, errlen, "gpu: %s", g->err[0] ? g->err : strerror(-r));
	gpu_fwd_free(g);
	return r;
}

static void drop_graphs(gpu_fwd *g)
{
	for (uint32_t i = 0; g->graph && i <= g->n_lw; i++)
		if (g->graph[i]) {
			cudaGraphExecDestroy(g->graph[i]);
			g->graph[i] = NULL;
		}
	g->graph_n = 0;
}

void gpu_fwd_free(gpu_fwd *g)
{
	if (!g)
		return;
	if (g->s)
		cudaStreamSynchronize(g->s);
	drop_graphs(g);
	free(g->graph);
	for (uint32_t l = 0; g->lw && l < g->n_lw; l++) {
		dev_layer *d = &g->lw[l];
		void *p[] = { d->attn_norm, d->qkv, d->o, d->ffn_norm, d->gu, d->down };

		for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
			cudaFree(p[i]);
	}
	free(g->lw);
	void *b[] = { g->k_center, g->out_norm, g->out, g->x, g->xn, g->qkv, g->att, g->gu, g->logits,
		      g->q16, g->k16, g->v16, g->pos, g->rows, g->ids, g->xn16, g->att16, g->gu16 };
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
		cudaFree(b[i]);
	for (uint32_t i = 0; g->ev && i < 3 * g->n_lw; i++)
		if (g->ev[i])
			cudaEventDestroy(g->ev[i]);
	free(g->ev);
	for (int i = 0; i < 2; i++)
		if (g->span[i])
			cudaEventDestroy(g->span[i]);
	if (g->h)
		g->cb.destroy(g->h);
	if (g->cb.lib)
		dlclose(g->cb.lib);
	if (g->s)
		cudaStreamDestroy(g->s);
	free(g);
}

void *gpu_fwd_stream(const gpu_fwd *g)
{
	return g->s;
}

const char *gpu_fwd_error(const gpu_fwd *g)
{
	return g->err;
}

/* y[t][r] = dot(row r of W, x[t]) (+ y[t][r] when acc) for T rows x
 * (ldx apart) and y (ldy apart, f32): column-major, W^T (rows x cols)
 * times x (cols x T).  W and x in f32, or both in f16 with GPU_FWD_F16
 * (accumulated in f32). */
static int gemm(gpu_fwd *g, const void *W, uint32_t rows, uint32_t cols, const void *x, uint32_t ldx, uint32_t T,
		float *y, uint32_t ldy, bool acc)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t st;

	if (g->f16)
		st = g->cb.gemm_ex(g->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)cols, &one, W, CUDA_R_16F,
				   (int)cols, x, CUDA_R_16F, (int)ldx, acc ? &one : &zero, y, CUDA_R_32F, (int)ldy,
				   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	else
		st = g->cb.sgemm(g->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)cols, &one, (const float *)W,
				 (int)cols, (const float *)x, (int)ldx, acc ? &one : &zero, y, (int)ldy);
	return st == CUBLAS_STATUS_SUCCESS ? 0 : gfail(g, -EIO, g->f16 ? "cublasGemmEx failed" : "cublasSgemm failed");
}

/* The norm of n rows of x (rows[i] for row i where rows is given, on the
 * device) into the products' input: xn, or xn16 with GPU_FWD_F16. */
static const void *norm_rows(gpu_fwd *g, const uint32_t *rows, const float *w, uint32_t n)
{
	const struct model_cfg *c = &g->c;

	if (g->f16) {
		k_rmsnorm<<<n, 256, 0, g->s>>>(g->x, rows, w, c->dim, c->eps, g->xn16);
		return g->xn16;
	}
	k_rmsnorm<<<n, 256, 0, g->s>>>(g->x, rows, w, c->dim, c->eps, g->xn);
	return g->xn;
}

/* Layer l's work before its K/V write, for n rows: the norm, the q/k/v
 * product, RoPE, the K center and the FP16 copies libkvq reads. */
static int pre_attention(gpu_fwd *g, uint32_t l, uint32_t n)
{
	const struct model_cfg *c = &g->c;
	const dev_layer *w = &g->lw[l];
	const uint32_t D = c->dim, kvd = c->kv_heads * c->head_dim, width = D + 2 * kvd;
	const float step = powf(c->rope_base, -2.0f / (float)c->head_dim);
	const void *xn = norm_rows(g, NULL, w->attn_norm, n);
	int r;

	if ((r = gemm(g, w->qkv, width, D, xn, D, n, g->qkv, width, false)) < 0)
		return r;
	k_qkv_ready<<<blocks((size_t)n * width / 2, 256), 256, 0, g->s>>>(
		g->qkv, n, D, kvd, c->head_dim, g->pos, step, g->k_center ? g->k_center + (size_t)l * kvd : NULL,
		g->q16, g->k16, g->v16);
	return cuda_ok(g, cudaGetLastError(), "a kernel launch");
}

/* Layer l's work after its attention: the output product into the
 * residual, the norm, the MLP. */
static int post_attention(gpu_fwd *g, uint32_t l, uint32_t n)
{
	const struct model_cfg *c = &g->c;
	const dev_layer *w = &g->lw[l];
	const uint32_t D = c->dim, F = c->ffn;
	int r;

	if ((r = gemm(g, w->o, D, D, g->f16 ? (const void *)g->att16 : g->att, D, n, g->x, D, true)) < 0)
		return r;
	const void *xn = norm_rows(g, NULL, w->ffn_norm, n);
	if ((r = gemm(g, w->gu, 2 * F, D, xn, D, n, g->gu, 2 * F, false)) < 0)
		return r;
	k_swiglu<<<blocks((size_t)n * F, 256), 256, 0, g->s>>>(g->gu, n, F, g->f16 ? g->gu16 : NULL);
	/* SwiGLU's output: f16 [n][F], or in place over the gates of [n][2 F] */
	if ((r = gemm(g, w->down, D, F, g->f16 ? (const void *)g->gu16 : g->gu, g->f16 ? F : 2 * F, n, g->x, D, true)) < 0)
		return r;
	return cuda_ok(g, cudaGetLastError(), "a kernel launch");
}

/* Stretch i of the layers (graph's comment) queued on g->s. */
static int stretch(gpu_fwd *g, uint32_t i, uint32_t n)
{
	int r = 0;

	if (i > 0)
		r = post_attention(g, i - 1, n);
	if (r == 0 && i < g->n_lw)
		r = pre_attention(g, i, n);
	return r;
}

/* Stretch i as a graph captured the first time it runs for n rows, then
 * replayed (the same kernels and arguments: the buffers do not move); a
 * failed capture turns graphs off and queues the stretch as it is. */
static int run_stretch(gpu_fwd *g, uint32_t i, uint32_t n)
{
	cudaGraph_t gr = NULL;
	int r;

	if (!g->graphs)
		return stretch(g, i, n);
	if (g->graph_n != n) {
		drop_graphs(g);
		g->graph_n = n;
	}
	if (!g->graph[i]) {
		if (cudaStreamBeginCapture(g->s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
			cudaGetLastError();
			g->graphs = false;
			return stretch(g, i, n);
		}
		r = stretch(g, i, n);
		if (cudaStreamEndCapture(g->s, &gr) != cudaSuccess || r < 0 ||
		    cudaGraphInstantiate(&g->graph[i], gr, 0) != cudaSuccess) {
			cudaGetLastError();
			if (gr)
				cudaGraphDestroy(gr);
			g->graph[i] = NULL;
			g->graphs = false;
			g->err[0] = 0;
			return stretch(g, i, n);
		}
		cudaGraphDestroy(gr);
	}
	return cuda_ok(g, cudaGraphLaunch(g->graph[i], g->s), "cudaGraphLaunch");
}

/* One layer's K/V write and attention for the step's n rows of b (q16 in,
 * att out), between event pairs on g->s: libkvq's own stream when the
 * client was given g->s (model_gpu.h), else the legacy stream's work waits
 * for them and they for it. */
static int kv_attention(gpu_fwd *g, kvq_batch *b, uint32_t l)
{
	cudaEvent_t *e = g->ev + 3 * (size_t)l;
	int r;

	if ((r = cuda_ok(g, cudaEventRecord(e[0], g->s), "cudaEventRecord")) < 0)
		return r;
	if ((r = kvq_batch_write(b, l, g->k16, g->v16)) < 0 ||
	    (r = cuda_ok(g, cudaEventRecord(e[1], g->s), "cudaEventRecord")) < 0)
		return r;
	if ((r = g->f16 ? kvq_batch_attention_device(b, l, g->c.heads, 0.0f, g->q16, g->att16, 0)
			: kvq_batch_attention_device(b, l, g->c.heads, 0.0f, g->q16, g->att, 1)) < 0)
		return r;
	return cuda_ok(g, cudaEventRecord(e[2], g->s), "cudaEventRecord");
}

/* The event pairs of the last step's layers, summed (waits for the last). */
static int sum_events(gpu_fwd *g)
{
	float w, a;
	int r;

	g->t_write = g->t_attention = 0;
	if ((r = cuda_ok(g, cudaEventSynchronize(g->span[1]), "waiting for the step")) < 0 ||
	    (r = cuda_ok(g, cudaEventElapsedTime(&w, g->span[0], g->span[1]), "cudaEventElapsedTime")) < 0)
		return r;
	g->t_span = w / 1e3;
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
	const uint32_t D = g->c.dim;
	int r;

	g->err[0] = 0;
	if (n == 0 || n > g->max_batch)
		return gfail(g, -EINVAL, "bad row count");
	/* pageable memory: each call returns once its source is read */
	if ((r = cuda_ok(g, cudaEventRecord(g->span[0], g->s), "cudaEventRecord")) < 0 ||
	    (r = cuda_ok(g, cudaMemcpyAsync(g->x, x, (size_t)n * D * 4, cudaMemcpyHostToDevice, g->s),
			 "copying embeddings")) < 0 ||
	    (r = cuda_ok(g, cudaMemcpyAsync(g->pos, pos, (size_t)n * 4, cudaMemcpyHostToDevice, g->s),
			 "copying positions")) < 0)
		return r;
	for (uint32_t l = 0; l <= g->n_lw; l++) {
		if ((r = run_stretch(g, l, n)) < 0)
			return r;
		if (l < g->n_lw && (r = kv_attention(g, b, l)) < 0)
			return r;   /* libkvq's leave g->err empty: kvq_client_error names them */
	}
	if ((r = cuda_ok(g, cudaEventRecord(g->span[1], g->s), "cudaEventRecord")) < 0)
		return r;
	return sum_events(g);
}

void gpu_fwd_times(const gpu_fwd *g, double *ret_write, double *ret_attention, double *ret_span)
{
	*ret_write = g->t_write;
	*ret_attention = g->t_attention;
	*ret_span = g->t_span;
}

/* The logits of rows[0..n_out) of the last layers into g->logits, queued. */
static int out_logits(gpu_fwd *g, const uint32_t *rows, uint32_t n_out)
{
	const struct model_cfg *c = &g->c;
	int r;

	if (n_out == 0 || n_out > g->max_batch)
		return gfail(g, -EINVAL, "bad row count");
	if ((r = cuda_ok(g, cudaMemcpyAsync(g->rows, rows, (size_t)n_out * 4, cudaMemcpyHostToDevice, g->s),
			 "copying rows")) < 0)
		return r;
	const void *xn = norm_rows(g, g->rows, g->out_norm, n_out);
	return gemm(g, g->out, g->out_rows, c->dim, xn, c->dim, n_out, g->logits, g->out_rows, false);
}

int gpu_fwd_logits(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, float *logits)
{
	int r = out_logits(g, rows, n_out);

	if (r < 0)
		return r;
	if ((r = cuda_ok(g, cudaMemcpyAsync(logits, g->logits, (size_t)n_out * g->out_rows * 4, cudaMemcpyDeviceToHost,
					     g->s), "copying logits")) < 0)
		return r;
	return cuda_ok(g, cudaStreamSynchronize(g->s), "copying logits");
}

int gpu_fwd_greedy(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, uint32_t *ids)
{
	int r = out_logits(g, rows, n_out);

	if (r < 0)
		return r;
	k_argmax<<<n_out, 256, 0, g->s>>>(g->logits, g->out_rows, g->ids);
	if ((r = cuda_ok(g, cudaGetLastError(), "a kernel launch")) < 0 ||
	    (r = cuda_ok(g, cudaMemcpyAsync(ids, g->ids, (size_t)n_out * 4, cudaMemcpyDeviceToHost, g->s),
			 "copying token ids")) < 0)
		return r;
	return cuda_ok(g, cudaStreamSynchronize(g->s), "copying token ids");
}
