/* SPDX-License-Identifier: Apache-2.0 */
/* A cuda pool's import into this process (cuda_import.c), for the cuda
 * backend (seq_cuda.c). */
#ifndef KVQ_CLIENT_CUDA_IMPORT_H
#define KVQ_CLIENT_CUDA_IMPORT_H

#include "libkvq_internal.h"
#include "cuda/driver.h"

struct client_cuda {
	CUdevice dev;                   /* the device whose primary context is retained */
	CUcontext ctx;                  /* its primary context, made current before CUDA work */
	struct kvq_driver_map map;      /* the pool in this process: c->base is map.va */
};

/* Imports fd (map_bytes of device memory on the daemon's device, identified
 * by uuid when it has 16 bytes, else by ordinal) and maps it read/write
 * through the device's primary context, which becomes current: sets
 * c->cuda, c->base and c->map_bytes (the backend's map operation). */
int cuda_import(kvq_client *c, int fd, uint64_t map_bytes, int ordinal, const uint8_t *uuid, size_t uuid_len);

/* Unmaps and releases what cuda_import made; nothing when c->cuda is NULL. */
void cuda_unimport(kvq_client *c);

/* Makes the pool's context current in the calling thread. */
int cuda_ready(kvq_client *c);

#endif
