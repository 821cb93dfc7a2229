/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool figures' table (daemon/figures.h) holds together, so that a row
 * is all a new figure needs: names a client shows are unique and fit the
 * wire's room, a labelled family's rows share its type and have distinct
 * labels, every family the rows name with a label is listed with its key
 * and HELP (and none is listed that no row uses), a family of one sample
 * is one row's, and the figures kvqd puts in PoolStats are the named rows
 * in the table's order with their values.
 */
#include <config.h>

#include <stdbool.h>
#include <string.h>

#include "../tap.h"
#include "figures.h"
#include "pools.h"

static bool same(const char *a, const char *b)
{
	return a && b && !strcmp(a, b);
}

int main(void)
{
	struct kvq_pools_info info = { 0 };
	const char *names[KVQ_FIGURES_MAX];
	uint64_t values[KVQ_FIGURES_MAX];
	size_t named = 0, n, bad_name = 0, bad_family = 0, bad_label = 0, unused = 0;

	for (size_t r = 0; r < kvq_figures_n; r++) {
		const struct kvq_figure *f = &kvq_figures[r];

		named += f->name != NULL;
		for (size_t q = 0; q < r; q++) {
			const struct kvq_figure *g = &kvq_figures[q];

			if (same(f->id, g->id) || same(f->name, g->name))
				bad_name++;
			if (!same(f->family, g->family))
				continue;
			/* one family: all labelled or one row; one type; distinct labels */
			if (!f->label || !g->label || f->type != g->type || same(f->label, g->label))
				bad_label++;
		}
		if (f->label && !kvq_figure_family(f->family))
			bad_family++;
		if (!f->label && f->family && kvq_figure_family(f->family))
			bad_family++;
		if (!f->meaning || !f->meaning[0] || (!f->name && !f->family))
			bad_name++;
	}
	for (size_t k = 0; k < kvq_figure_families_n; k++) {
		bool used = false;

		for (size_t r = 0; r < kvq_figures_n; r++)
			used |= same(kvq_figures[r].family, kvq_figure_families[k].family);
		unused += !used;
	}
	ok(kvq_figures_n > 30 && named <= KVQ_FIGURES_MAX, "%zu rows, %zu of them named (room for %u)", kvq_figures_n,
	   named, KVQ_FIGURES_MAX);
	ok(bad_name == 0, "ids and names are unique, every row has a meaning and a consumer (%zu bad)", bad_name);
	ok(bad_family == 0 && unused == 0, "labelled rows' families are listed, one-sample families are not, and "
	   "every listed family has rows (%zu, %zu bad)", bad_family, unused);
	ok(bad_label == 0, "a family's rows are all labelled, of one type, with distinct labels (%zu bad)", bad_label);
	ok(same(kvq_figure_type_name(KVQ_FIGURE_COUNTER), "counter") && same(kvq_figure_type_name(KVQ_FIGURE_GAUGE),
										  "gauge"), "type names");

	/* what PoolStats gets: the named rows, in order, with their values */
	info.block_tokens = 16;   /* bytes per token divides by it */
	info.clients = 3;
	info.st.sealed_private = 7;
	info.st.sealed_cached = 5;
	info.lookup_tokens = 1000;
	n = kvq_figures_named(&info, names, values, KVQ_FIGURES_MAX);
	{
		size_t k = 0;
		bool in_order = n == named;

		for (size_t r = 0; r < kvq_figures_n && in_order; r++) {
			if (!kvq_figures[r].name)
				continue;
			in_order = same(names[k], kvq_figures[r].name) && values[k] == kvq_figures[r].value(&info);
			k++;
		}
		ok(in_order, "kvq_figures_named: the %zu named rows in order with their values", n);
	}
	{
		uint64_t held = ~0ull, cached = ~0ull, clients = ~0ull, lookup = ~0ull;

		for (size_t k = 0; k < n; k++) {
			held = same(names[k], "sealed_held") ? values[k] : held;
			cached = same(names[k], "cached") ? values[k] : cached;
			clients = same(names[k], "clients") ? values[k] : clients;
			lookup = same(names[k], "lookup_tokens") ? values[k] : lookup;
		}
		ok(held == 7 && cached == 5 && clients == 3 && lookup == 1000,
		   "the frozen names carry the pool's figures: sealed_held %llu, cached %llu, clients %llu, "
		   "lookup_tokens %llu", (unsigned long long)held, (unsigned long long)cached,
		   (unsigned long long)clients, (unsigned long long)lookup);
	}
	ok(kvq_figures_named(&info, names, values, 2) == 2, "at most the room given");
	return done_testing();
}
