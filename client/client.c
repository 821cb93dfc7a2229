/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's connection to kvqd (kvq_client_*) and the sequence helper
 * (kvq_seq_*).  Synchronous: one request, one reply; the protocol allows
 * pipelining, which a later version can use for a decode step's batch.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "cpu/cpu.h"

#ifdef KVQ_WITH_CUDA
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "cuda/kvq_cuda.h"
#endif
#include "conn.h"
#include "kvq.h"
#include "layout.h"

/* A daemon that stops answering must not hang a worker forever. */
#define CLIENT_TIMEOUT_MS 30000

struct kvq_client {
	struct kvq_conn conn;           /* its msg: kvq_client_error; its pool_fd: the attach reply's until mapped */
	struct kvq_policy pol;
	struct kvq_layout *L;
	void *base;                     /* host: mmap address; cuda: device address */
	size_t map_bytes;
#ifdef KVQ_WITH_CUDA
	CUdevice cu_dev;                /* cuda pools: the device whose primary context is retained */
	CUcontext cu_ctx;               /* its primary context, made current before CUDA work */
	cudaStream_t stream;            /* where libkvq's kernels and copies run (NULL: legacy default) */
	uint64_t cu_va;                 /* cuda pools: reserved and mapped range, 0 if none */
	size_t cu_reserved;
#endif
	char backend[8];
	char pool[KVQ_PROTO_MAX_NAME + 1];
};

__attribute__((format(printf, 3, 4)))
static int fail(kvq_client *c, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->conn.msg, sizeof(c->conn.msg), fmt, ap);
	va_end(ap);
	return r;
}

#ifdef KVQ_WITH_CUDA
/*
 * Importing a cuda pool (daemon/backend.h says what an importer does).  The
 * driver is reached through cudaGetDriverEntryPointByVersion of the
 * statically linked cudart, never by linking libcuda, so libkvq loads
 * where there is no driver and only attaching to a cuda pool fails there.
 */
#define CUDA_ABI 12000

static struct {
	int status;
	char reason[200];
	PFN_cuGetErrorName_v6000 get_error_name;
	PFN_cuInit_v2000 init;
	PFN_cuDeviceGetCount_v2000 device_count;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetUuid_v11040 device_uuid;
	PFN_cuDevicePrimaryCtxRetain_v7000 ctx_retain;
	PFN_cuDevicePrimaryCtxRelease_v11000 ctx_release;
	PFN_cuCtxSetCurrent_v4000 ctx_set;
	PFN_cuMemGetAllocationGranularity_v10020 mem_granularity;
	PFN_cuMemImportFromShareableHandle_v10020 mem_import;
	PFN_cuMemAddressReserve_v10020 addr_reserve;
	PFN_cuMemAddressFree_v10020 addr_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_access;
	PFN_cuMemRelease_v10020 mem_release;
} cu;

#define CU_SYM(sym, field) { #sym, (void **)&cu.field }
static const struct {
	const char *name;
	void **slot;
} cu_syms[] = {
	CU_SYM(cuGetErrorName, get_error_name), CU_SYM(cuInit, init),
	CU_SYM(cuDeviceGetCount, device_count), CU_SYM(cuDeviceGet, device_get),
	CU_SYM(cuDeviceGetUuid, device_uuid), CU_SYM(cuDevicePrimaryCtxRetain, ctx_retain),
	CU_SYM(cuDevicePrimaryCtxRelease, ctx_release), CU_SYM(cuCtxSetCurrent, ctx_set),
	CU_SYM(cuMemGetAllocationGranularity, mem_granularity),
	CU_SYM(cuMemImportFromShareableHandle, mem_import), CU_SYM(cuMemAddressReserve, addr_reserve),
	CU_SYM(cuMemAddressFree, addr_free), CU_SYM(cuMemMap, mem_map), CU_SYM(cuMemUnmap, mem_unmap),
	CU_SYM(cuMemSetAccess, mem_access), CU_SYM(cuMemRelease, mem_release),
};
#undef CU_SYM

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
	for (size_t i = 0; i < sizeof(cu_syms) / sizeof(cu_syms[0]); i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		cudaError_t e = cudaGetDriverEntryPointByVersion(cu_syms[i].name, cu_syms[i].slot, CUDA_ABI,
								 cudaEnableDefault, &q);

		if (e != cudaSuccess) {
			snprintf(cu.reason, sizeof(cu.reason), "no usable CUDA driver: %s (%s)", cudaGetErrorName(e),
				 cudaGetErrorString(e));
			cu.status = -ENODEV;
			return;
		}
		if (q != cudaDriverEntryPointSuccess || !*cu_syms[i].slot) {
			snprintf(cu.reason, sizeof(cu.reason), "CUDA driver lacks %s (ABI %d.%d)", cu_syms[i].name,
				 CUDA_ABI / 1000, CUDA_ABI % 1000 / 10);
			cu.status = -ENODEV;
			return;
		}
	}
	CUresult r = cu.init(0);

	if (r != CUDA_SUCCESS) {
		const char *n = NULL;

		cu.get_error_name(r, &n);
		snprintf(cu.reason, sizeof(cu.reason), "cuInit: %s", n ? n : "CUDA error");
		cu.status = -ENODEV;
	}
}

static int cu_fail(kvq_client *c, const char *what, CUresult r)
{
	const char *n = NULL;

	if (cu.get_error_name)
		cu.get_error_name(r, &n);
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return fail(c, -ENOMEM, "%s: %s", what, n ? n : "CUDA error");
	case CUDA_ERROR_INVALID_VALUE:
		return fail(c, -EINVAL, "%s: %s", what, n ? n : "CUDA error");
	case CUDA_ERROR_NOT_SUPPORTED:
		return fail(c, -ENOTSUP, "%s: %s", what, n ? n : "CUDA error");
	default:
		return fail(c, -EIO, "%s: %s (%d)", what, n ? n : "CUDA error", (int)r);
	}
}

static void cu_unmap(kvq_client *c)
{
	if (!c->cu_reserved)
		return;
	if (c->base)
		cu.mem_unmap(c->cu_va, c->map_bytes);
	cu.addr_free(c->cu_va, c->cu_reserved);
	cu.ctx_release(c->cu_dev);
	c->cu_va = 0;
	c->cu_reserved = 0;
	c->base = NULL;
}

/* Imports fd (map_bytes of device memory on the daemon's device, identified
 * by uuid when it has 16 bytes, else by ordinal) and maps it read/write. */
static int cu_attach(kvq_client *c, int fd, uint64_t map_bytes, int ordinal, const uint8_t *uuid, size_t uuid_len)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	CUdeviceptr va = 0;
	CUcontext ctx;
	CUdevice dev = 0;
	size_t gran = 0, reserve;
	int n = 0, found = 0;
	CUresult r;

	pthread_once(&cu_once, cu_load);
	if (cu.status < 0)
		return fail(c, cu.status, "pool is on the cuda backend: %s", cu.reason);
	r = cu.device_count(&n);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuDeviceGetCount", r);
	if (uuid_len == sizeof(CUuuid)) {
		for (int i = 0; i < n && !found; i++) {
			CUuuid u;

			if (cu.device_get(&dev, i) == CUDA_SUCCESS && cu.device_uuid(&u, dev) == CUDA_SUCCESS &&
			    !memcmp(u.bytes, uuid, sizeof(u.bytes)))
				found = 1;
		}
		if (!found)
			return fail(c, -ENODEV, "the pool's device (uuid from kvqd) is not visible to this process");
	} else {
		if (ordinal < 0 || ordinal >= n)
			return fail(c, -ENODEV, "the pool's device %d is not visible (%d devices)", ordinal, n);
		r = cu.device_get(&dev, ordinal);
		if (r != CUDA_SUCCESS)
			return cu_fail(c, "cuDeviceGet", r);
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	r = cu.mem_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuMemGetAllocationGranularity", r);
	if (!gran || map_bytes > SIZE_MAX - gran)
		return fail(c, KVQ_EPROTOCOL, "cuda pool of %llu bytes", (unsigned long long)map_bytes);
	reserve = ((size_t)map_bytes + gran - 1) / gran * gran;
	r = cu.ctx_retain(&ctx, dev);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuDevicePrimaryCtxRetain", r);
	r = cu.ctx_set(ctx);
	if (r != CUDA_SUCCESS) {
		cu.ctx_release(dev);
		return cu_fail(c, "cuCtxSetCurrent", r);
	}
	r = cu.mem_import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		cu.ctx_release(dev);
		return cu_fail(c, "cuMemImportFromShareableHandle", r);
	}
	r = cu.addr_reserve(&va, reserve, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		cu.mem_release(h);
		cu.ctx_release(dev);
		return cu_fail(c, "cuMemAddressReserve", r);
	}
	c->cu_dev = dev;
	c->cu_ctx = ctx;
	c->cu_va = va;
	c->cu_reserved = reserve;
	r = cu.mem_map(va, (size_t)map_bytes, 0, h, 0);
	cu.mem_release(h); /* the mapping keeps the memory */
	if (r != CUDA_SUCCESS) {
		cu_unmap(c);
		return cu_fail(c, "cuMemMap", r);
	}
	c->map_bytes = (size_t)map_bytes;
	c->base = (void *)(uintptr_t)va;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = cu.mem_access(va, (size_t)map_bytes, &acc, 1);
	if (r != CUDA_SUCCESS) {
		cu_unmap(c);
		return cu_fail(c, "cuMemSetAccess", r);
	}
	return 0;
}
#endif

int kvq_client_connect(const char *path, const char *name, kvq_client **ret_client)
{
	kvq_client *c;
	int r;

	if (!ret_client)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	kvq_conn_init(&c->conn, CLIENT_TIMEOUT_MS);
	r = kvq_conn_open(&c->conn, path, name ? name : "libkvq");
	if (r < 0) {
		kvq_client_free(c);
		return r;
	}
	*ret_client = c;
	return 0;
}

void kvq_client_free(kvq_client *c)
{
	if (!c)
		return;
	/* the CPU kernels are synchronous: no work on the pool is pending;
	 * CUDA work is drained before the mapping goes */
#ifdef KVQ_WITH_CUDA
	if (c->cu_reserved) {
		if (cu.ctx_set(c->cu_ctx) == CUDA_SUCCESS)
			cudaStreamSynchronize(c->stream);
		cu_unmap(c);
	}
#endif
	if (c->base)
		munmap(c->base, c->map_bytes);
	kvq_conn_close(&c->conn);
	kvq_layout_free(c->L);
	free(c);
}

const char *kvq_client_error(const kvq_client *c)
{
	return c ? c->conn.msg : "";
}

uint64_t kvq_client_id(const kvq_client *c)
{
	return c ? c->conn.client_id : 0;
}

const struct kvq_layout *kvq_client_layout(const kvq_client *c)
{
	return c && c->base ? c->L : NULL;
}

void *kvq_client_base(const kvq_client *c)
{
	return c ? c->base : NULL;
}

const char *kvq_client_backend(const kvq_client *c)
{
	return c && c->base ? c->backend : NULL;
}

#ifdef KVQ_WITH_CUDA
/* A sequence's pool is host or cuda: attach accepts no other backend, and
 * a libkvq without CUDA refuses cuda pools there. */
static bool is_cuda(const kvq_client *c)
{
	return c->base && !strcmp(c->backend, "cuda");
}
#endif

int kvq_client_set_stream(kvq_client *c, void *stream)
{
	if (!c)
		return -EINVAL;
#ifdef KVQ_WITH_CUDA
	c->stream = (cudaStream_t)stream;
	return 0;
#else
	return stream ? -ENOTSUP : 0;
#endif
}

int kvq_client_attach(kvq_client *c, const struct kvq_attach_params *p)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	struct kvq_layout_params lp;
	struct kvq_layout *L = NULL;
	const Kvq__AttachReply *ar;
	char err[256];
	void *base;
	int r;

	if (!c || !p || !p->pool || !p->model_id || !p->policy)
		return -EINVAL;
	if (c->base || c->L)
		return fail(c, -EISCONN, "already attached to pool %s", c->pool);
	a.pool = (char *)p->pool;
	a.model_id = (char *)p->model_id;
	a.layers = p->layers;
	a.kv_heads = p->kv_heads;
	a.head_dim = p->head_dim;
	a.block_tokens = p->block_tokens;
	a.policy = (char *)p->policy;
	a.window = p->window;
	a.act = p->act == KVQ_ACT_BF16 ? KVQ__DTYPE__DTYPE_BF16 : KVQ__DTYPE__DTYPE_F16;
	a.layout_version = KVQ_LAYOUT_VERSION;
	if (p->create) {
		pc.n_sealed = p->n_sealed;
		pc.n_open = p->n_open;
		pc.backend = (char *)(p->backend ? p->backend : "");
		pc.device = p->device;
		a.create = &pc;
	}
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_ATTACH_REPLY, &rep);
	if (r < 0)
		goto out;
	ar = rep->attach_reply;
	if (strcmp(ar->backend, "host") && strcmp(ar->backend, "cuda")) {
		r = fail(c, KVQ_EPROTOCOL, "pool %s is on an unknown backend '%s'", p->pool, ar->backend);
		goto out;
	}
#ifndef KVQ_WITH_CUDA
	if (!strcmp(ar->backend, "cuda")) {
		/* never a silent host fallback on device memory */
		r = fail(c, -ENOTSUP, "pool %s is on the cuda backend; this libkvq was built without CUDA", p->pool);
		goto out;
	}
#endif
	if (c->conn.pool_fd < 0 || ar->map_bytes < ar->total_bytes || ar->map_bytes > SIZE_MAX) {
		r = fail(c, KVQ_EPROTOCOL, "attach reply without a descriptor or with a bad size");
		goto out;
	}
	if (kvq_policy_parse(ar->policy, ar->layers, &c->pol, err, sizeof(err)) < 0) {
		r = fail(c, KVQ_EPROTOCOL, "pool policy '%s': %s", ar->policy, err);
		goto out;
	}
	lp = (struct kvq_layout_params){ .layers = ar->layers, .kv_heads = ar->kv_heads, .head_dim = ar->head_dim,
		.block_tokens = ar->block_tokens, .window = ar->window, .n_sealed = ar->n_sealed,
		.n_open = ar->n_open, .act = (int)ar->act, .policy = &c->pol };
	if (ar->layout_version != KVQ_LAYOUT_VERSION) {
		r = fail(c, KVQ_ELAYOUT, "pool layout version %u, libkvq has %u", ar->layout_version,
			 KVQ_LAYOUT_VERSION);
		goto out;
	}
	if (kvq_layout_new(&lp, &L, err, sizeof(err)) < 0) {
		r = fail(c, KVQ_ELAYOUT, "pool layout: %s", err);
		goto out;
	}
	if (L->total_bytes != ar->total_bytes || L->window != ar->window) {
		r = fail(c, KVQ_ELAYOUT, "pool layout: kvqd counts %llu bytes, libkvq %llu",
			 (unsigned long long)ar->total_bytes, (unsigned long long)L->total_bytes);
		goto out;
	}
#ifdef KVQ_WITH_CUDA
	if (!strcmp(ar->backend, "cuda")) {
		r = cu_attach(c, c->conn.pool_fd, ar->map_bytes, ar->device, ar->device_uuid.data, ar->device_uuid.len);
		if (r < 0)
			goto out;
		/* the mapping keeps the memory; the descriptor is not needed again */
		close(c->conn.pool_fd);
		c->conn.pool_fd = -1;
	} else
#endif
	{
		base = mmap(NULL, (size_t)ar->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->conn.pool_fd, 0);
		if (base == MAP_FAILED) {
			r = fail(c, -errno, "mapping the pool: %s", strerror(errno));
			goto out;
		}
		/* the mapping keeps the memory; the descriptor is not needed again */
		close(c->conn.pool_fd);
		c->conn.pool_fd = -1;
		c->base = base;
		c->map_bytes = (size_t)ar->map_bytes;
	}
	c->L = L;
	L = NULL;
	snprintf(c->backend, sizeof(c->backend), "%s", ar->backend);
	snprintf(c->pool, sizeof(c->pool), "%s", p->pool);
out:
	if (c->conn.pool_fd >= 0) {
		close(c->conn.pool_fd);
		c->conn.pool_fd = -1;
	}
	kvq_layout_free(L);
	kvq_frame_envelope_free(rep);
	return r;
}

int kvq_client_alloc(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t *ret_open, uint32_t *ret_reserved,
		     uint32_t *ret_sealed)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	const Kvq__AllocReply *ar;
	int r;

	if (!c || (n_open && (!ret_open || !ret_reserved)) || (n_sealed && !ret_sealed))
		return -EINVAL;
	a.n_open = n_open;
	a.n_sealed = n_sealed;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_ALLOC_REPLY, &rep);
	if (r < 0)
		return r;
	ar = rep->alloc_reply;
	if (ar->n_open_ids != n_open || ar->n_reserved_ids != n_open || ar->n_sealed_ids != n_sealed) {
		kvq_frame_envelope_free(rep);
		c->conn.broken = true;   /* the daemon holds slots we cannot name: drop them all */
		return fail(c, KVQ_EPROTOCOL, "alloc reply with the wrong counts");
	}
	if (n_open) {
		memcpy(ret_open, ar->open_ids, n_open * sizeof(uint32_t));
		memcpy(ret_reserved, ar->reserved_ids, n_open * sizeof(uint32_t));
	}
	if (n_sealed)
		memcpy(ret_sealed, ar->sealed_ids, n_sealed * sizeof(uint32_t));
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_client_seal(kvq_client *c, uint32_t n, const uint32_t *open_ids, const uint32_t *sealed_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Seal s = KVQ__SEAL__INIT;

	if (!c || (n && (!open_ids || !sealed_ids)))
		return -EINVAL;
	s.n_open_ids = s.n_sealed_ids = n;
	s.open_ids = (uint32_t *)open_ids;
	s.sealed_ids = (uint32_t *)sealed_ids;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &s;
	return kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_SEAL_REPLY, NULL);
}

int kvq_client_publish(kvq_client *c, uint32_t n, const uint32_t *sealed_ids, int64_t parent, const uint32_t *tokens,
		       const void *salt, size_t salt_len, uint32_t *ret_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Publish p = KVQ__PUBLISH__INIT;
	Kvq__PublishBlock *b = NULL, **bp = NULL;
	uint32_t B;
	int r;

	if (!c || !c->L || !n || !sealed_ids || !tokens || !ret_ids || salt_len > KVQ_PROTO_MAX_SALT ||
	    parent > (int64_t)UINT32_MAX || n > KVQ_PROTO_MAX_IDS)
		return -EINVAL;
	B = c->L->block_tokens;
	b = calloc(n, sizeof(*b));
	bp = calloc(n, sizeof(*bp));
	if (!b || !bp) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		kvq__publish_block__init(&b[i]);
		b[i].sealed_id = sealed_ids[i];
		if (i || parent >= 0) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			b[i].parent_id = i ? sealed_ids[i - 1] : (uint32_t)parent;
		}
		b[i].n_tokens = B;
		b[i].tokens = (uint32_t *)tokens + (size_t)i * B;
		b[i].salt.data = (uint8_t *)salt;
		b[i].salt.len = salt ? salt_len : 0;
		bp[i] = &b[i];
	}
	p.n_blocks = n;
	p.blocks = bp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &p;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_PUBLISH_REPLY, &rep);
	if (r < 0)
		goto out;
	if (rep->publish_reply->n_ids != n) {
		c->conn.broken = true;
		r = fail(c, KVQ_EPROTOCOL, "publish reply with the wrong count");
		goto out;
	}
	memcpy(ret_ids, rep->publish_reply->ids, n * sizeof(uint32_t));
out:
	kvq_frame_envelope_free(rep);
	free(bp);
	free(b);
	return r;
}

int kvq_client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t *ret_n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Lookup l = KVQ__LOOKUP__INIT;
	size_t n;
	int r;

	if (!c || !c->L || (n_tokens && !tokens) || max_tokens > n_tokens || !ret_n ||
	    (max_tokens >= c->L->block_tokens && !ret_ids) || salt_len > KVQ_PROTO_MAX_SALT)
		return -EINVAL;
	l.n_tokens = n_tokens;
	l.tokens = (uint32_t *)tokens;
	l.max_tokens = max_tokens;
	l.salt.data = (uint8_t *)salt;
	l.salt.len = salt ? salt_len : 0;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, &rep);
	if (r < 0)
		return r;
	n = rep->lookup_reply->n_sealed_ids;
	if (n > max_tokens / c->L->block_tokens) {
		kvq_frame_envelope_free(rep);
		c->conn.broken = true;   /* references we cannot name: drop them all */
		return fail(c, KVQ_EPROTOCOL, "lookup reply longer than asked for");
	}
	if (n)
		memcpy(ret_ids, rep->lookup_reply->sealed_ids, n * sizeof(uint32_t));
	*ret_n = (uint32_t)n;
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_client_release(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		       const uint32_t *open_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Release rl = KVQ__RELEASE__INIT;

	if (!c || (n_sealed && !sealed_ids) || (n_open && !open_ids))
		return -EINVAL;
	rl.n_sealed_ids = n_sealed;
	rl.sealed_ids = (uint32_t *)sealed_ids;
	rl.n_open_ids = n_open;
	rl.open_ids = (uint32_t *)open_ids;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &rl;
	return kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_RELEASE_REPLY, NULL);
}

int kvq_client_fork(kvq_client *c, uint32_t n, const uint32_t *sealed_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Fork f = KVQ__FORK__INIT;

	if (!c || (n && !sealed_ids))
		return -EINVAL;
	f.n_sealed_ids = n;
	f.sealed_ids = (uint32_t *)sealed_ids;
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &f;
	return kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_FORK_REPLY, NULL);
}

int kvq_client_stats(kvq_client *c, const char *pool, struct kvq_stats *ret_stats)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	const Kvq__StatsReply *sr;
	int r;

	if (!c || !ret_stats)
		return -EINVAL;
	if (!pool)
		pool = c->pool;
	if (!*pool)
		return fail(c, -EINVAL, "no pool named and none attached");
	s.pool = (char *)pool;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, &rep);
	if (r < 0)
		return r;
	sr = rep->stats_reply;
	r = fail(c, -ENOENT, "kvqd reports no pool %s", pool);
	for (size_t i = 0; i < sr->n_pools; i++) {
		const Kvq__PoolStats *p = sr->pools[i];
		struct kvq_stats st = { 0 };

		if (strcmp(p->name, pool))
			continue;
		snprintf(st.name, sizeof(st.name), "%s", p->name);
		snprintf(st.model_id, sizeof(st.model_id), "%s", p->model_id);
		snprintf(st.backend, sizeof(st.backend), "%s", p->backend);
		st.device = p->device;
		st.layers = p->layers;
		st.kv_heads = p->kv_heads;
		st.head_dim = p->head_dim;
		st.block_tokens = p->block_tokens;
		st.window = p->window;
		st.total_bytes = p->total_bytes;
		st.n_sealed = p->n_sealed;
		st.n_open = p->n_open;
		st.sealed_free = p->sealed_free;
		st.sealed_reserved = p->sealed_reserved;
		st.sealed_held = p->sealed_held;
		st.cached = p->cached;
		st.referenced = p->referenced;
		st.open_used = p->open_used;
		st.lookup_tokens = p->lookup_tokens;
		st.hit_tokens = p->hit_tokens;
		st.evictions = p->evictions;
		st.alloc_failures = p->alloc_failures;
		st.clients = p->clients;
		*ret_stats = st;
		c->conn.msg[0] = 0;
		r = 0;
		break;
	}
	kvq_frame_envelope_free(rep);
	return r;
}

/* ---------------------------------------------------------------- sequence */

/*
 * State: n tokens; sealed[0..n_sealed) hold the first n_sealed*B tokens,
 * open[0..n_open) (with resv[]) the rest.  Normally n_sealed*B = S(n);
 * right after from_prompt it is n (all sealed).  Writes are given to
 * kvq_cpu_write shifted by n_sealed blocks (its n is n - n_sealed*B), which
 * covers both: the kernel's split of the shifted sequence equals the real
 * one whenever the sealed prefix stays sealed.
 */
struct kvq_seq {
	kvq_client *c;
	uint8_t salt[KVQ_PROTO_MAX_SALT];
	size_t salt_len;
	uint32_t *tokens;
	uint32_t n, cap;
	int32_t *sealed;
	uint32_t n_sealed, n_pub;       /* sealed[0..n_pub) are published */
	int32_t *open, *resv;
	uint32_t n_open;
	/* write in progress (begin .. commit) */
	bool busy;
	uint32_t m;
	int32_t *p_sealed, *p_open, *p_resv;
	uint32_t p_n_sealed, p_n_open;
	uint8_t *written;               /* per layer */
#ifdef KVQ_WITH_CUDA
	/* cuda pools: the record and block table a kernel reads, and staging
	 * for inputs and outputs in host memory, both in device memory */
	void *d_table, *d_stage, *d_work;
	size_t d_table_cap, d_stage_cap, d_work_cap;
#endif
};

#ifdef KVQ_WITH_CUDA
/*
 * The CUDA side of a sequence on a cuda pool.  Everything runs on the
 * client's stream, in order; libkvq drains that stream before it tells kvqd
 * a block is sealed or published (no one may find a block before its bytes
 * are there) and before it releases slots (no kernel of ours may still read
 * them when another client gets them).
 */
static int gpu_err(kvq_client *c, const char *what, cudaError_t e)
{
	return fail(c, -EIO, "%s: %s", what, cudaGetErrorString(e));
}

/* Makes the pool's context current in the calling thread. */
static int gpu_ready(kvq_client *c)
{
	CUresult r = cu.ctx_set(c->cu_ctx);

	return r == CUDA_SUCCESS ? 0 : cu_fail(c, "cuCtxSetCurrent", r);
}

static int gpu_drain(kvq_client *c)
{
	cudaError_t e = cudaStreamSynchronize(c->stream);

	return e == cudaSuccess ? 0 : gpu_err(c, "waiting for the pool's CUDA work", e);
}

/* Grows a device buffer to need bytes; its old contents are dropped, after
 * the work that may still read them. */
static int gpu_grow(kvq_client *c, void **buf, size_t *cap, size_t need)
{
	cudaError_t e;
	int r;

	if (need <= *cap)
		return 0;
	if ((r = gpu_drain(c)) < 0)
		return r;
	cudaFree(*buf);
	*buf = NULL;
	*cap = 0;
	need = need < 4096 ? 4096 : need + need / 2;
	if ((e = cudaMalloc(buf, need)) != cudaSuccess)
		return gpu_err(c, "cudaMalloc", e);
	*cap = need;
	return 0;
}

/*
 * Sends a kernel's sequence record with its block table to device memory:
 * [record][sealed ids][open ids], one copy.  The record (struct
 * kvq_cuda_seq or kvq_cuda_write_seq: the same shape) gets a, b, c and the
 * device addresses of the two tables; *ret is the record's device address.
 */
static int gpu_table(kvq_seq *s, uint32_t a, uint32_t b, uint32_t c3, const int32_t *sealed, uint32_t ns,
		     const int32_t *open, uint32_t no, void **ret)
{
	kvq_client *c = s->c;
	struct kvq_cuda_seq rec = { .n = a, .n_q = b, .q_row0 = c3 };
	size_t bytes = sizeof(rec) + ((size_t)ns + no) * sizeof(int32_t);
	uint8_t *h = malloc(bytes);
	cudaError_t e;
	int r;

	if (!h)
		return -ENOMEM;
	r = gpu_grow(c, &s->d_table, &s->d_table_cap, bytes);
	if (r == 0) {
		uint8_t *d = s->d_table;
		rec.sealed = (const int32_t *)(d + sizeof(rec));
		rec.open = (const int32_t *)(d + sizeof(rec) + (size_t)ns * sizeof(int32_t));
		memcpy(h, &rec, sizeof(rec));
		if (ns)
			memcpy(h + sizeof(rec), sealed, (size_t)ns * sizeof(int32_t));
		if (no)
			memcpy(h + sizeof(rec) + (size_t)ns * sizeof(int32_t), open, (size_t)no * sizeof(int32_t));
		e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->stream);
		r = e == cudaSuccess ? 0 : gpu_err(c, "copying the block table", e);
		*ret = d;
	}
	free(h);
	return r;
}

static bool gpu_is_device(const void *p)
{
	struct cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		cudaGetLastError();   /* a plain host pointer on older runtimes */
		return false;
	}
	return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* One layer's write on the GPU: k and v in device memory are read where
 * they are, host arrays are copied first. */
static int gpu_write(kvq_seq *s, uint32_t layer, const struct kvq_seq_write *w, uint32_t ns, uint32_t no,
		     const void *k, const void *v)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const size_t bytes = (size_t)w->m * L->kv_heads * L->head_dim * kvq_dtype_bytes(L->act);
	void *rec = NULL;
	cudaError_t e;
	int r;

	if ((r = gpu_ready(c)) < 0)
		return r;
	if (!gpu_is_device(k) || !gpu_is_device(v)) {
		if ((r = gpu_grow(c, &s->d_stage, &s->d_stage_cap, 2 * bytes)) < 0)
			return r;
		if ((e = cudaMemcpyAsync(s->d_stage, k, bytes, cudaMemcpyDefault, c->stream)) != cudaSuccess ||
		    (e = cudaMemcpyAsync((uint8_t *)s->d_stage + bytes, v, bytes, cudaMemcpyDefault, c->stream)) !=
			    cudaSuccess)
			return gpu_err(c, "copying K and V to the device", e);
		k = s->d_stage;
		v = (uint8_t *)s->d_stage + bytes;
	}
	if ((r = gpu_table(s, w->n, w->m, 0, w->sealed, ns, w->open, no, &rec)) < 0)
		return r;
	r = kvq_cuda_write(L, c->base, layer, rec, 1, w->m, k, v, c->stream);
	return r < 0 ? fail(c, r, "kvq_cuda_write: %s", r == -EIO ? kvq_cuda_error() : "refused") : 0;
}

/* Attention on the GPU with q (activation dtype) and out (f32 or the
 * activation dtype) in device memory, queued on the client's stream. */
static int gpu_attention(kvq_seq *s, uint32_t layer, const struct kvq_attn_seq *as, uint32_t ns, uint32_t no,
			 uint32_t q_heads, float scale, const void *q, void *out, bool out_f32)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const struct kvq_layer_layout *ll = &L->layer[layer];
	struct kvq_cuda_attn a = { .L = L, .base = c->base, .layer = layer, .q_heads = q_heads, .scale = scale,
		.q_dtype = L->act, .out_dtype = out_f32 ? KVQ_DT_F32 : L->act, .max_n = as->n, .max_q = as->n_q,
		.total_q = as->n_q, .stream = c->stream };
	void *rec = NULL;
	size_t ws;
	int r;

	if ((r = gpu_ready(c)) < 0)
		return r;
	ws = kvq_cuda_attention_workspace(&a, 1);
	if ((r = gpu_grow(c, &s->d_work, &s->d_work_cap, ws)) < 0)
		return r;
	a.workspace = ws ? s->d_work : NULL;
	a.workspace_bytes = ws;
	if ((r = gpu_table(s, as->n, as->n_q, 0, as->sealed, ns, as->open, no, &rec)) < 0)
		return r;
	r = kvq_cuda_attention(&a, rec, 1, q, out);
	if (r == -ENOTSUP)
		return fail(c, r, "no CUDA attention for k=%s,v=%s at head dim %u", kvq_fmt_name(ll->kfmt),
			    kvq_fmt_name(ll->vfmt), L->head_dim);
	if (r < 0)
		return fail(c, r, "kvq_cuda_attention: %s", r == -EIO ? kvq_cuda_error() : "refused");
	return 0;
}

/* The same for float host arrays, converted to and from the activation
 * dtype around the kernel; returns when out is written. */
static int gpu_attention_host(kvq_seq *s, uint32_t layer, const struct kvq_attn_seq *as, uint32_t ns,
			      uint32_t no, uint32_t q_heads, float scale, const float *q, float *out)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const size_t nel = (size_t)as->n_q * q_heads * L->head_dim, bytes = nel * 2;
	uint16_t *h = NULL;
	cudaError_t e;
	int r;

	if ((r = gpu_ready(c)) < 0 || (r = gpu_grow(c, &s->d_stage, &s->d_stage_cap, 2 * bytes)) < 0)
		return r;
	h = malloc(bytes);
	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < nel; i++)
		h[i] = L->act == KVQ_DT_BF16 ? kvq_bf16_from_f32(q[i]) : kvq_f16_from_f32(q[i]);
	if ((e = cudaMemcpyAsync(s->d_stage, h, bytes, cudaMemcpyHostToDevice, c->stream)) != cudaSuccess) {
		r = gpu_err(c, "copying q to the device", e);
		goto out;
	}
	r = gpu_attention(s, layer, as, ns, no, q_heads, scale, s->d_stage, (uint8_t *)s->d_stage + bytes, false);
	if (r < 0)
		goto out;
	if ((e = cudaMemcpyAsync(h, (uint8_t *)s->d_stage + bytes, bytes, cudaMemcpyDeviceToHost, c->stream)) !=
		    cudaSuccess ||
	    (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
		r = gpu_err(c, "attention output", e);
		goto out;
	}
	for (size_t i = 0; i < nel; i++)
		out[i] = L->act == KVQ_DT_BF16 ? kvq_bf16_to_f32(h[i]) : kvq_f16_to_f32(h[i]);
out:
	free(h);
	return r;
}
#endif

static int seq_reserve_tokens(kvq_seq *s, uint32_t need)
{
	uint32_t *t;
	uint32_t cap = s->cap ? s->cap : 256;

	if (need <= s->cap)
		return 0;
	while (cap < need)
		cap = cap > UINT32_MAX / 2 ? need : cap * 2;
	t = realloc(s->tokens, (size_t)cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	s->tokens = t;
	s->cap = cap;
	return 0;
}

int kvq_seq_new(kvq_client *c, const void *salt, size_t salt_len, kvq_seq **ret_seq)
{
	kvq_seq *s;

	if (!c || !c->base || !ret_seq || salt_len > KVQ_PROTO_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->written = calloc(c->L->layers, 1);
	if (!s->written) {
		free(s);
		return -ENOMEM;
	}
	s->c = c;
	if (salt_len)
		memcpy(s->salt, salt, salt_len);
	s->salt_len = salt_len;
	*ret_seq = s;
	return 0;
}

static void seq_drop_pending(kvq_seq *s)
{
	free(s->p_sealed);
	free(s->p_open);
	free(s->p_resv);
	s->p_sealed = s->p_open = s->p_resv = NULL;
	s->p_n_sealed = s->p_n_open = 0;
	s->busy = false;
}

/* Ids a pending write allocated beyond the committed table: released on
 * free or when begin fails half-way. */
static void seq_pending_new(const kvq_seq *s, uint32_t *sealed, uint32_t *ns, uint32_t *open, uint32_t *no)
{
	uint32_t nb_old = s->n_sealed + s->n_open;

	*ns = *no = 0;
	for (uint32_t b = nb_old; b < s->p_n_sealed; b++)
		sealed[(*ns)++] = (uint32_t)s->p_sealed[b];
	for (uint32_t j = 0; j < s->p_n_open; j++) {
		uint32_t b = s->n_sealed + j;
		if (b >= nb_old && s->p_open[j] >= 0)
			open[(*no)++] = (uint32_t)s->p_open[j];
	}
}

void kvq_seq_free(kvq_seq *s)
{
	uint32_t *sealed = NULL, *open = NULL, ns = 0, no = 0;
	size_t cap;

	if (!s)
		return;
#ifdef KVQ_WITH_CUDA
	/* no kernel of ours may read the slots once they are released */
	if (is_cuda(s->c) && gpu_ready(s->c) == 0) {
		gpu_drain(s->c);
		cudaFree(s->d_table);
		cudaFree(s->d_stage);
		cudaFree(s->d_work);
	}
#endif
	cap = (size_t)s->n_sealed + s->n_open + s->p_n_sealed + s->p_n_open + 1;
	sealed = malloc(cap * sizeof(*sealed));
	open = malloc(cap * sizeof(*open));
	if (sealed && open) {
		if (s->busy)
			seq_pending_new(s, sealed, &ns, open, &no);
		for (uint32_t i = 0; i < s->n_sealed; i++)
			sealed[ns++] = (uint32_t)s->sealed[i];
		for (uint32_t i = 0; i < s->n_open; i++)
			open[no++] = (uint32_t)s->open[i];
		/* a failed release leaves the holds to the connection's close */
		for (uint32_t i = 0; i < ns || i < no; i += KVQ_PROTO_MAX_IDS / 2) {
			uint32_t a = ns > i ? ns - i : 0, b = no > i ? no - i : 0;
			a = a > KVQ_PROTO_MAX_IDS / 2 ? KVQ_PROTO_MAX_IDS / 2 : a;
			b = b > KVQ_PROTO_MAX_IDS / 2 ? KVQ_PROTO_MAX_IDS / 2 : b;
			if (kvq_client_release(s->c, a, sealed + i, b, open + i) < 0)
				break;
		}
	}
	free(sealed);
	free(open);
	seq_drop_pending(s);
	free(s->tokens);
	free(s->sealed);
	free(s->open);
	free(s->resv);
	free(s->written);
	free(s);
}

kvq_client *kvq_seq_client(const kvq_seq *s)
{
	return s ? s->c : NULL;
}

uint32_t kvq_seq_tokens(const kvq_seq *s)
{
	return s ? s->n : 0;
}

int kvq_seq_blocks(const kvq_seq *s, const int32_t **ret_sealed, uint32_t *ret_n_sealed, const int32_t **ret_open,
		   uint32_t *ret_n_open)
{
	if (!s)
		return -EINVAL;
	if (ret_sealed)
		*ret_sealed = s->sealed;
	if (ret_n_sealed)
		*ret_n_sealed = s->n_sealed;
	if (ret_open)
		*ret_open = s->open;
	if (ret_n_open)
		*ret_n_open = s->n_open;
	return 0;
}

int kvq_seq_from_prompt(kvq_seq *s, const uint32_t *tokens, uint32_t n, uint32_t *ret_hit)
{
	const struct kvq_layout *L;
	uint32_t max, got = 0, *ids;
	int r;

	if (!s || (n && !tokens) || !ret_hit)
		return -EINVAL;
	if (n > KVQ_PROTO_MAX_TOKENS)
		return fail(s->c, -E2BIG, "a prompt of %u tokens is over the lookup limit", n);
	if (s->n || s->busy)
		return fail(s->c, -EBUSY, "from_prompt on a sequence that is not empty");
	L = s->c->L;
	max = kvq_layout_split(L, n);
	if (max / L->block_tokens > KVQ_PROTO_MAX_IDS)
		max = KVQ_PROTO_MAX_IDS * L->block_tokens;
	if (max == 0) {
		*ret_hit = 0;
		return 0;
	}
	ids = malloc((size_t)(max / L->block_tokens) * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	r = kvq_client_lookup(s->c, tokens, n, max, s->salt,
			      s->salt_len, ids, &got);
	if (r == 0 && got) {
		uint32_t hit = got * L->block_tokens;

		r = seq_reserve_tokens(s, hit);
		if (r == 0) {
			int32_t *sl = realloc(s->sealed, got * sizeof(*sl));
			if (!sl)
				r = -ENOMEM;
			else
				s->sealed = sl;
		}
		if (r < 0) {
			kvq_client_release(s->c, got, ids, 0, NULL);
		} else {
			for (uint32_t i = 0; i < got; i++)
				s->sealed[i] = (int32_t)ids[i];
			s->n_sealed = s->n_pub = got;
			memcpy(s->tokens, tokens, hit * sizeof(*tokens));
			s->n = hit;
		}
	}
	free(ids);
	if (r == 0)
		*ret_hit = got * L->block_tokens;
	return r;
}

int kvq_seq_begin(kvq_seq *s, const uint32_t *tokens, uint32_t m)
{
	const struct kvq_layout *L;
	uint32_t B, N, s1, nb_old, nb_new, n_new_open = 0, n_new_sealed = 0, *ao = NULL, *ar = NULL, *as = NULL;
	int r;

	if (!s || !tokens || !m)
		return -EINVAL;
	if (s->busy)
		return fail(s->c, -EBUSY, "a write is in progress (commit first)");
	L = s->c->L;
	B = L->block_tokens;
	if (s->n > UINT32_MAX - B - m)
		return -EINVAL;
	N = s->n + m;
	s1 = kvq_layout_split(L, N) / B;
	if (s1 < s->n_sealed)
		return fail(s->c, -EINVAL, "appending %u tokens would unseal the cached prefix: append the whole prompt",
			    m);
	nb_old = s->n_sealed + s->n_open;
	nb_new = (N + B - 1) / B;
	for (uint32_t b = nb_old; b < nb_new; b++) {
		if (b < s1)
			n_new_sealed++;
		else
			n_new_open++;
	}
	if (n_new_open + n_new_sealed > KVQ_PROTO_MAX_IDS)
		return fail(s->c, -E2BIG, "%u tokens need more than %u blocks in one request", m, KVQ_PROTO_MAX_IDS);
	r = seq_reserve_tokens(s, N);
	if (r < 0)
		return r;
	s->p_sealed = calloc(s1 + 1, sizeof(int32_t));
	s->p_open = calloc(nb_new - s->n_sealed + 1, sizeof(int32_t));
	s->p_resv = calloc(nb_new - s->n_sealed + 1, sizeof(int32_t));
	ao = calloc(n_new_open + 1, sizeof(*ao));
	ar = calloc(n_new_open + 1, sizeof(*ar));
	as = calloc(n_new_sealed + 1, sizeof(*as));
	if (!s->p_sealed || !s->p_open || !s->p_resv || !ao || !ar || !as) {
		r = -ENOMEM;
		goto out;
	}
	r = kvq_client_alloc(s->c, n_new_open, n_new_sealed, ao, ar, as);
	if (r < 0)
		goto out;
	/* the table after the write: blocks < s1 sealed, the rest open */
	for (uint32_t b = 0; b < s->n_sealed; b++)
		s->p_sealed[b] = s->sealed[b];
	for (uint32_t b = s->n_sealed, io = 0, is = 0; b < nb_new; b++) {
		uint32_t j = b - s->n_sealed;

		if (b < nb_old) {
			s->p_open[j] = s->open[j];
			s->p_resv[j] = s->resv[j];
			if (b < s1)
				s->p_sealed[b] = s->resv[j];   /* sealed into its reservation */
		} else if (b < s1) {
			s->p_open[j] = -1;                  /* straight from the input */
			s->p_resv[j] = -1;
			s->p_sealed[b] = (int32_t)as[is++];
		} else {
			s->p_open[j] = (int32_t)ao[io];
			s->p_resv[j] = (int32_t)ar[io++];
		}
	}
	s->p_n_sealed = s1;
	s->p_n_open = nb_new - s->n_sealed;
	memcpy(s->tokens + s->n, tokens, (size_t)m * sizeof(*tokens));
	s->m = m;
	memset(s->written, 0, L->layers);
	s->busy = true;
out:
	if (r < 0)
		seq_drop_pending(s);
	free(ao);
	free(ar);
	free(as);
	return r;
}

int kvq_seq_write(kvq_seq *s, uint32_t layer, const void *k, const void *v)
{
	struct kvq_seq_write w;
	uint32_t B;
	int r;

	if (!s || !k || !v)
		return -EINVAL;
	if (!s->busy || layer >= s->c->L->layers)
		return fail(s->c, -EINVAL, "write without begin, or layer %u out of range", layer);
	B = s->c->L->block_tokens;
	/* shifted past the committed sealed prefix (see struct kvq_seq) */
	w.n = s->n - s->n_sealed * B;
	w.m = s->m;
	w.sealed = s->p_sealed + s->n_sealed;
	w.open = s->p_open;
#ifdef KVQ_WITH_CUDA
	if (is_cuda(s->c)) {
		r = gpu_write(s, layer, &w, s->p_n_sealed - s->n_sealed, s->p_n_open, k, v);
		if (r < 0)
			return r;
		s->written[layer] = 1;
		return 0;
	}
#endif
	r = kvq_cpu_write(s->c->L, s->c->base, layer, &w, k, v);
	if (r < 0)
		return fail(s->c, r, "kvq_cpu_write refused the block table");
	s->written[layer] = 1;
	return 0;
}

int kvq_seq_commit(kvq_seq *s)
{
	const struct kvq_layout *L;
	uint32_t B, s1, nb_old, n_seal = 0, *so = NULL, *ss = NULL, *ids = NULL, *pub = NULL, np;
	int32_t *nopen = NULL, *nresv = NULL;
	int r;

	if (!s)
		return -EINVAL;
	L = s->c->L;
	B = L->block_tokens;
	if (!s->busy)
		return fail(s->c, -EINVAL, "commit without begin");
	for (uint32_t l = 0; l < L->layers; l++)
		if (!s->written[l])
			return fail(s->c, -EINVAL, "commit before layer %u was written", l);
	s1 = s->p_n_sealed;
	nb_old = s->n_sealed + s->n_open;
	so = calloc(s->n_open + 1, sizeof(*so));
	ss = calloc(s->n_open + 1, sizeof(*ss));
	nopen = calloc(s->p_n_open + 1, sizeof(*nopen));
	nresv = calloc(s->p_n_open + 1, sizeof(*nresv));
	if (!so || !ss || !nopen || !nresv) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t b = s->n_sealed; b < nb_old && b < s1; b++) {
		so[n_seal] = (uint32_t)s->open[b - s->n_sealed];
		ss[n_seal++] = (uint32_t)s->resv[b - s->n_sealed];
	}
	/* the write sealed them already; on the GPU, once the stream drains */
#ifdef KVQ_WITH_CUDA
	if (is_cuda(s->c) && (n_seal || s->p_n_sealed > s->n_pub) && ((r = gpu_ready(s->c)) < 0 || (r = gpu_drain(s->c)) < 0))
		goto out;
#endif
	if (n_seal) {
		r = kvq_client_seal(s->c, n_seal, so, ss);
		if (r < 0)
			goto out;
	}
	{
		/* adopt the new table: s->sealed grows to s1, open is what is left */
		int32_t *sl = realloc(s->sealed, (s1 + 1) * sizeof(*sl));
		uint32_t no = 0;

		if (!sl) {
			r = -ENOMEM;   /* holds stay valid; free releases them */
			goto out;
		}
		s->sealed = sl;
		memcpy(s->sealed, s->p_sealed, s1 * sizeof(*sl));
		for (uint32_t b = s1; b < s->n_sealed + s->p_n_open; b++) {
			nopen[no] = s->p_open[b - s->n_sealed];
			nresv[no++] = s->p_resv[b - s->n_sealed];
		}
		free(s->open);
		free(s->resv);
		s->open = nopen;
		s->resv = nresv;
		nopen = nresv = NULL;
		s->n_open = no;
		s->n_sealed = s1;
		s->n += s->m;
		seq_drop_pending(s);
	}
	np = s->n_sealed - s->n_pub;
	if (np) {
		pub = malloc(np * sizeof(*pub));
		ids = malloc(np * sizeof(*ids));
		if (!pub || !ids) {
			r = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 0; i < np; i++)
			pub[i] = (uint32_t)s->sealed[s->n_pub + i];
		r = kvq_client_publish(s->c, np, pub, s->n_pub ? s->sealed[s->n_pub - 1] : -1,
				       s->tokens + (size_t)s->n_pub * B, s->salt_len ? s->salt : NULL, s->salt_len,
				       ids);
		if (r < 0)
			goto out;
		/* a duplicate of a cached block: use the cached one from now on */
		for (uint32_t i = 0; i < np; i++)
			s->sealed[s->n_pub + i] = (int32_t)ids[i];
		s->n_pub = s->n_sealed;
	}
	r = 0;
out:
	free(so);
	free(ss);
	free(nopen);
	free(nresv);
	free(pub);
	free(ids);
	return r;
}

/* The table attention of n_q query rows reads now, checked; *ns and *no
 * are its sealed and open counts. */
static int seq_attn_table(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, struct kvq_attn_seq *as,
			  uint32_t *ns, uint32_t *no)
{
	const struct kvq_layout *L = s->c->L;

	if (layer >= L->layers)
		return -EINVAL;
	if (s->busy) {
		if (!s->written[layer])
			return fail(s->c, -EINVAL, "attention on layer %u before its write", layer);
		as->n = s->n + s->m;
		as->sealed = s->p_sealed;
		as->open = s->p_open + (s->p_n_sealed - s->n_sealed);
		*ns = s->p_n_sealed;
		*no = s->p_n_open - (s->p_n_sealed - s->n_sealed);
	} else {
		/* right after from_prompt the table has no open window: the
		 * kernel's split would not match it */
		if (s->n_sealed * L->block_tokens != kvq_layout_split(L, s->n))
			return fail(s->c, -EINVAL, "attention needs the rest of the prompt appended first");
		as->n = s->n;
		as->sealed = s->sealed;
		as->open = s->open;
		*ns = s->n_sealed;
		*no = s->n_open;
	}
	as->n_q = n_q;
	if (!n_q || n_q > as->n || !q_heads || q_heads % L->kv_heads)
		return fail(s->c, -EINVAL, "attention: bad query counts");
	return 0;
}

int kvq_seq_attention(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale, const float *q,
		      float *out)
{
	const struct kvq_layout *L;
	struct kvq_attn a;
	struct kvq_attn_seq as;
	uint32_t ns, no;
	int r;

	if (!s || !q || !out)
		return -EINVAL;
	L = s->c->L;
	if ((r = seq_attn_table(s, layer, q_heads, n_q, &as, &ns, &no)) < 0)
		return r;
	scale = scale > 0 ? scale : 1.0f / sqrtf((float)L->head_dim);
#ifdef KVQ_WITH_CUDA
	if (is_cuda(s->c))
		return gpu_attention_host(s, layer, &as, ns, no, q_heads, scale, q, out);
#endif
	a = (struct kvq_attn){ .L = L, .base = s->c->base, .layer = layer, .q_heads = q_heads, .scale = scale,
		.q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	r = kvq_cpu_attention(&a, &as, 1, q, out);
	if (r < 0)
		return fail(s->c, r, "attention: bad query counts");
	return 0;
}

int kvq_seq_attention_device(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale,
			     const void *q, void *out, int out_f32)
{
#ifdef KVQ_WITH_CUDA
	struct kvq_attn_seq as;
	uint32_t ns, no;
	int r;

	if (!s || !q || !out)
		return -EINVAL;
	if (!is_cuda(s->c))
		return fail(s->c, -ENOTSUP, "attention on device memory needs a cuda pool");
	if ((r = seq_attn_table(s, layer, q_heads, n_q, &as, &ns, &no)) < 0)
		return r;
	scale = scale > 0 ? scale : 1.0f / sqrtf((float)s->c->L->head_dim);
	return gpu_attention(s, layer, &as, ns, no, q_heads, scale, q, out, out_f32 != 0);
#else
	(void)layer, (void)q_heads, (void)n_q, (void)scale, (void)out_f32;
	if (!s || !q || !out)
		return -EINVAL;
	return fail(s->c, -ENOTSUP, "attention on device memory needs a cuda pool (libkvq built without CUDA)");
#endif
}

int kvq_seq_fork(kvq_seq *s, kvq_seq **ret_seq)
{
	const struct kvq_layout *L;
	kvq_seq *f = NULL;
	uint32_t *ids = NULL, *ao = NULL, *ar = NULL;
	bool forked = false, opened = false;
	int r;

	if (!s || !ret_seq)
		return -EINVAL;
	if (s->busy)
		return fail(s->c, -EBUSY, "fork during a write");
	L = s->c->L;
	r = kvq_seq_new(s->c, s->salt, s->salt_len, &f);
	if (r < 0)
		return r;
	ids = calloc(s->n_sealed + 1, sizeof(*ids));
	ao = calloc(s->n_open + 1, sizeof(*ao));
	ar = calloc(s->n_open + 1, sizeof(*ar));
	f->sealed = calloc(s->n_sealed + 1, sizeof(int32_t));
	f->open = calloc(s->n_open + 1, sizeof(int32_t));
	f->resv = calloc(s->n_open + 1, sizeof(int32_t));
	if (!ids || !ao || !ar || !f->sealed || !f->open || !f->resv || seq_reserve_tokens(f, s->n ? s->n : 1) < 0) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < s->n_sealed; i++)
		ids[i] = (uint32_t)s->sealed[i];
	if (s->n_sealed) {
		r = kvq_client_fork(s->c, s->n_sealed, ids);
		if (r < 0)
			goto out;
		forked = true;
	}
	if (s->n_open) {
		r = kvq_client_alloc(s->c, s->n_open, 0, ao, ar, NULL);
		if (r < 0)
			goto out;
		opened = true;
	}
#ifdef KVQ_WITH_CUDA
	if (is_cuda(s->c) && s->n_open && (r = gpu_ready(s->c)) < 0)
		goto out;
#endif
	for (uint32_t i = 0; i < s->n_open; i++) {
		for (uint32_t l = 0; l < L->layers; l++) {
			uint8_t *b = s->c->base;
			/* an open slice is contiguous over all heads */
			uint8_t *to = b + kvq_layout_off(L, KVQ_OPEN, ao[i], l, 0, KVQ_K_CODES);
			const uint8_t *from = b + kvq_layout_off(L, KVQ_OPEN, (uint32_t)s->open[i], l, 0, KVQ_K_CODES);
#ifdef KVQ_WITH_CUDA
			if (is_cuda(s->c)) {
				/* in stream order: later kernels see the copy */
				cudaError_t e = cudaMemcpyAsync(to, from, L->layer[l].open_slice, cudaMemcpyDeviceToDevice,
								s->c->stream);
				if (e != cudaSuccess) {
					r = gpu_err(s->c, "copying the open window", e);
					goto out;
				}
				continue;
			}
#endif
			memcpy(to, from, L->layer[l].open_slice);
		}
		f->open[i] = (int32_t)ao[i];
		f->resv[i] = (int32_t)ar[i];
	}
	memcpy(f->sealed, s->sealed, s->n_sealed * sizeof(int32_t));
	f->n_sealed = s->n_sealed;
	f->n_pub = s->n_pub;
	f->n_open = s->n_open;
	if (s->n)
		memcpy(f->tokens, s->tokens, (size_t)s->n * sizeof(*f->tokens));
	f->n = s->n;
	*ret_seq = f;
	f = NULL;
	r = 0;
out:
	if (f) {
		/* undo what the daemon granted; kvq_seq_free releases f's table */
#ifdef KVQ_WITH_CUDA
		if (is_cuda(s->c) && opened && gpu_ready(s->c) == 0)
			gpu_drain(s->c);   /* copies into ao may be in flight */
#endif
		if (forked)
			kvq_client_release(s->c, s->n_sealed, ids, 0, NULL);
		if (opened)
			kvq_client_release(s->c, 0, NULL, s->n_open, ao);
		kvq_seq_free(f);
	}
	free(ids);
	free(ao);
	free(ar);
	return r;
}
