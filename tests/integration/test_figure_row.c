/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A new pool figure is one row of kvqd's figure table (daemon/figures.h):
 * this test runs a kvqd built with a throwaway row (tests/unit/figure_row.h,
 * force-included into tests/figrow/kvqd and nowhere else) and finds the
 * figure, with its value, through everything this build's own clients
 * have, none of which knows it: libkvq's accessor and list, kvqctl --json
 * stats and kvqctl stats, and the metrics text (a family of its own, after
 * the table's other families).  The figures every kvqd has keep their
 * places: struct kvq_stats gives the same counts as the accessor.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "../daemon.h"
#include "../metrics.h"
#include "../unit/figure_row.h"
#include "kvq.h"

#define POOL "rowpool"

static char tmpdir[64], sock_path[100], daemon_bin[512];

int main(void)
{
	const char *top = getenv("top_builddir"), *env_ctl = getenv("KVQ_TEST_KVQCTL");
	static char out[1 << 16], text[1 << 20], cmd[1024];
	const uint64_t want = TEST_FIGURE_BASE + 1;   /* one connection attached */
	char ctl[512], extra[128], fam[160], line[160];
	const struct kvq_attach_params ap = { .pool = POOL, .model_id = "figrow", .layers = 2, .kv_heads = 2,
		.head_dim = 64, .block_tokens = 16, .policy = "int8", .act = KVQ_ACT_F16, .create = 1, .device = -1 };
	kvq_pool_figures *f = NULL;
	struct kvq_stats st;
	kvq_client *c = NULL;
	const char *name;
	uint64_t v = 0, held = 0;
	size_t n, at = 0;
	bool listed = false;
	ssize_t len;
	FILE *pf;
	int port, r;
	pid_t d;

	snprintf(ctl, sizeof(ctl), "%s", env_ctl ? env_ctl : "");
	if (!env_ctl)
		snprintf(ctl, sizeof(ctl), "%s/kvqctl/kvqctl", top ? top : ".");
	if (!getenv("KVQ_TEST_KVQD")) {
		snprintf(daemon_bin, sizeof(daemon_bin), "%s/tests/figrow/kvqd", top ? top : ".");
		setenv("KVQ_TEST_KVQD", daemon_bin, 1);
	}
	port = free_port();
	snprintf(extra, sizeof(extra), "metrics_listen = 127.0.0.1:%d\n", port);
	d = test_daemon_start_conf("host", "figrow", extra, tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path),
				   daemon_bin, sizeof(daemon_bin));
	if (!ok(d > 0 && port > 0, "the kvqd with the throwaway row starts (%s)", daemon_bin))
		return done_testing();
	r = kvq_client_connect(sock_path, "figrow", &c);
	if (r == 0 && (r = kvq_client_attach(c, &ap)) < 0)
		diag("attach: %s", kvq_client_error(c));
	if (!ok(r == 0, "a libkvq client attaches to pool " POOL " (created by the attach)")) {
		kvq_client_free(c);
		c = NULL;
	}

	/* libkvq: by name and in the list */
	r = c ? kvq_client_pool_stat(c, POOL, TEST_FIGURE_NAME, &v) : -1;
	ok(r == 0 && v == want, "kvq_client_pool_stat(\"" TEST_FIGURE_NAME "\") = %llu (want %llu)", (unsigned long long)v,
	   (unsigned long long)want);
	ok(c && kvq_client_pool_stat(c, NULL, "no_such_figure", &v) == -ENOENT &&
	   strstr(kvq_client_error(c), "no_such_figure"), "a figure kvqd does not have: -ENOENT, named");
	if (c && kvq_client_pool_figures(c, NULL, &f) == 0) {
		n = kvq_pool_figures_count(f);
		for (size_t i = 0; i < n; i++)
			if (kvq_pool_figures_at(f, i, &name, &v) == 0 && !strcmp(name, TEST_FIGURE_NAME)) {
				listed = v == want;
				at = i;
			}
		ok(listed && at == n - 1, "kvq_client_pool_figures lists it, last (the table's order), of %zu", n);
		ok(kvq_pool_figures_at(f, n, &name, &v) == -ENOENT, "past the last figure: -ENOENT");
			r = kvq_pool_figures_get(f, "sealed_held", &held) == 0 && kvq_client_stats(c, NULL, &st) == 0 &&
		    st.sealed_held == held && kvq_pool_figures_get(f, "n_sealed", &v) == 0 && st.n_sealed == v && v > 0;
		ok(r, "struct kvq_stats' figures are the figures of their names (n_sealed %llu)", (unsigned long long)v);
		kvq_pool_figures_free(f);
	} else {
		ok(0, "kvq_client_pool_figures");
		ok(0, "past the last figure");
		ok(0, "struct kvq_stats' figures");
	}

	/* kvqctl, which has no place of its own for it */
	ok(ctl_stats_json(ctl, sock_path, POOL, out, sizeof(out)) == 0 &&
	   jnum(out, "\"" POOL "\"", TEST_FIGURE_NAME) == (double)want,
	   "kvqctl --json stats shows \"" TEST_FIGURE_NAME "\": %llu", (unsigned long long)want);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' stats " POOL, ctl, sock_path);
	snprintf(line, sizeof(line), "\n  %-15s %llu\n", TEST_FIGURE_NAME, (unsigned long long)want);
	pf = popen(cmd, "r");
	len = pf ? (ssize_t)fread(out, 1, sizeof(out) - 1, pf) : -1;
	if (pf)
		pclose(pf);
	out[len > 0 ? len : 0] = 0;
	ok(len > 0 && strstr(out, line), "kvqctl stats shows it as a line of its own");

	/* the metrics: a family of its own, after the others of the table */
	len = http_get(port, "/metrics", text, sizeof(text));
	snprintf(fam, sizeof(fam), "# HELP " TEST_FIGURE_FAMILY " A throwaway figure: 4200 + the connections "
		 "attached.\n# TYPE " TEST_FIGURE_FAMILY " gauge\n" TEST_FIGURE_FAMILY "{pool=\"" POOL "\"} ");
	ok(len > 0 && strstr(text, fam) && metric(text, TEST_FIGURE_FAMILY "{pool=\"" POOL "\"} ") == (double)want,
	   "the metrics have " TEST_FIGURE_FAMILY "{pool=\"" POOL "\"} %llu with its HELP and TYPE",
	   (unsigned long long)want);
	ok(len > 0 && strstr(text, "# TYPE kvq_resident_tokens gauge") &&
	   strstr(text, "# TYPE kvq_resident_tokens gauge") < strstr(text, "# TYPE " TEST_FIGURE_FAMILY) &&
	   strstr(text, "# TYPE " TEST_FIGURE_FAMILY) < strstr(text, "# TYPE kvq_attention_bins_total"),
	   "its family comes after the table's others, before the attention timings");
	{
		char *body = len > 0 ? strstr(text, "\r\n\r\n") : NULL;

		ok(body && parse_exposition(body + 4) > 0, "the text exposition still parses");
	}

	kvq_client_free(c);
	test_daemon_stop(d, tmpdir);
	return done_testing();
}
