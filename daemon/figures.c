/* SPDX-License-Identifier: Apache-2.0 */
/* The pool figures' table made into rows (figures.h). */
#include <config.h>

#include <string.h>

#include "figures.h"

#define GETTER(id, name, type, family, label, meaning, expr) \
	static uint64_t figure_##id(const struct kvq_pools_info *i) { return (expr); }
KVQ_POOL_FIGURES(GETTER)
#undef GETTER

#define ROW(id, name, type, family, label, meaning, expr) \
	{ #id, name, KVQ_FIGURE_##type, family, label, meaning, figure_##id },
const struct kvq_figure kvq_figures[] = { KVQ_POOL_FIGURES(ROW) };
#undef ROW
const size_t kvq_figures_n = sizeof(kvq_figures) / sizeof(kvq_figures[0]);
_Static_assert(sizeof(kvq_figures) / sizeof(kvq_figures[0]) <= KVQ_FIGURES_MAX, "KVQ_FIGURES_MAX is too small");

#define FAMILY(family, key, help) { family, key, help },
const struct kvq_figure_family kvq_figure_families[] = { KVQ_POOL_FAMILIES(FAMILY) };
#undef FAMILY
const size_t kvq_figure_families_n = sizeof(kvq_figure_families) / sizeof(kvq_figure_families[0]);

const struct kvq_figure_family *kvq_figure_family(const char *family)
{
	for (size_t f = 0; f < kvq_figure_families_n; f++)
		if (!strcmp(kvq_figure_families[f].family, family))
			return &kvq_figure_families[f];
	return NULL;
}

const char *kvq_figure_type_name(enum kvq_figure_type t)
{
	return t == KVQ_FIGURE_COUNTER ? "counter" : "gauge";
}

size_t kvq_figures_named(const struct kvq_pools_info *i, const char **names, uint64_t *values, size_t max)
{
	size_t n = 0;

	for (size_t r = 0; r < kvq_figures_n && n < max; r++) {
		if (!kvq_figures[r].name)
			continue;
		names[n] = kvq_figures[r].name;
		values[n] = kvq_figures[r].value(i);
		n++;
	}
	return n;
}

void kvq_figures_stats(const struct kvq_pools_rec *p, struct kvq_figures_stats *ret)
{
	Kvq__PoolStats *o = &ret->ps;
	const char *names[KVQ_FIGURES_MAX];
	uint64_t values[KVQ_FIGURES_MAX];
	struct kvq_pools_info i;
	size_t n;

	kvq_pools_info(p, &i);
	kvq__pool_stats__init(o);
	o->name = (char *)i.name;
	o->model_id = (char *)i.model;
	o->policy = (char *)i.policy;
	o->backend = (char *)i.backend;
	o->device = i.device;
	o->layers = i.layers;
	o->kv_heads = i.kv_heads;
	o->head_dim = i.head_dim;
	o->block_tokens = i.block_tokens;
	o->window = i.window;
	o->act = (Kvq__DType)i.act;
	o->group = (char *)i.group;
	o->rank = i.rank;
	o->world_size = i.world_size;
	o->sink_blocks = i.sink_blocks;
	o->restart_cold = (char *)i.restart.cold;
	if (i.codebooks_sha256) {
		o->codebooks_sha256.data = (uint8_t *)i.codebooks_sha256;
		o->codebooks_sha256.len = KVQ_PROTO_SHA256;
	}
	n = kvq_figures_named(&i, names, values, KVQ_FIGURES_MAX);
	for (size_t k = 0; k < n; k++) {
		kvq__figure__init(&ret->fig[k]);
		ret->fig[k].name = (char *)names[k];
		ret->fig[k].value = values[k];
		ret->figp[k] = &ret->fig[k];
	}
	o->n_figures = n;
	o->figures = ret->figp;
}
