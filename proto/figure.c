/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's figures by name (figure.h). */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "figure.h"

ssize_t kvq_figure_index(const Kvq__PoolStats *p, const char *name)
{
	/* a few dozen short names: a scan is what a lookup costs here */
	for (size_t k = 0; k < p->n_figures; k++)
		if (!strcmp(p->figures[k]->name, name))
			return (ssize_t)k;
	return -1;
}

int kvq_figure_get(const Kvq__PoolStats *p, const char *name, uint64_t *ret_value)
{
	ssize_t k = kvq_figure_index(p, name);

	if (k < 0)
		return -ENOENT;
	*ret_value = p->figures[k]->value;
	return 0;
}

uint64_t kvq_figure_or_0(const Kvq__PoolStats *p, const char *name)
{
	uint64_t v = 0;

	kvq_figure_get(p, name, &v);
	return v;
}
