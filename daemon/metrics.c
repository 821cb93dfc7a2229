/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition of kvqd's pools and requests (metrics.h). */
#include <config.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "conf.h"
#include "conf_value.h"
#include "figures.h"
#include "format.h"
#include "hist.h"
#include "kvq_wire.h"
#include "log.h"
#include "metrics.h"
#include "server.h"
#include "seterr.h"
#include "timing_buckets.h"

/* A scrape is a small GET; anything larger is not one. */
#define METRICS_MAX_HEADERS 8192
#define METRICS_TIMEOUT_S 10

struct kvq_metrics {
	struct evhttp *http;
	kvq_server *server;
};

/* One family's HELP and TYPE lines. */
static void family(struct evbuffer *b, const char *name, const char *type, const char *help)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Pool names are [A-Za-z0-9._-] (config) or printable ASCII without blanks
 * (protocol): only '"' and '\\' need escaping in a label value. */
static void label(struct evbuffer *b, const char *v)
{
	for (; *v; v++) {
		if (*v == '"' || *v == '\\')
			evbuffer_add(b, "\\", 1);
		evbuffer_add(b, v, 1);
	}
}

/* NAME{pool="P"[,EXTRA]} VALUE */
static void sample(struct evbuffer *b, const char *name, const char *pool, const char *extra, uint64_t v)
{
	evbuffer_add_printf(b, "%s{pool=\"", name);
	label(b, pool);
	evbuffer_add_printf(b, "\"%s%s} %llu\n", extra ? "," : "", extra ? extra : "", (unsigned long long)v);
}

/* NAME{pool="P",KEY="names[j]"} v[j] for j < n. */
static void samples(struct evbuffer *b, const char *name, const char *pool, const char *key,
		    const char *const *names, const uint64_t *v, size_t n)
{
	char extra[64];

	for (size_t j = 0; j < n; j++) {
		snprintf(extra, sizeof(extra), "%s=\"%s\"", key, names[j]);
		sample(b, name, pool, extra, v[j]);
	}
}

/* The first row of family (kvq_figures[] index). */
static size_t family_first(const char *family)
{
	size_t r = 0;

	while (r < kvq_figures_n && !(kvq_figures[r].family && !strcmp(kvq_figures[r].family, family)))
		r++;
	return r;
}

/* The per-pool families of the figures' table (figures.h): each at its
 * first row, one sample per pool, or a labelled family's rows in order. */
static void write_figures(kvq_server *s, struct evbuffer *b)
{
	struct kvq_pools_info i;
	char extra[128];

	for (size_t r = 0; r < kvq_figures_n; r++) {
		const struct kvq_figure *f = &kvq_figures[r];
		const struct kvq_figure_family *fam;

		if (!f->family || family_first(f->family) != r)
			continue;
		fam = f->label ? kvq_figure_family(f->family) : NULL;
		family(b, f->family, kvq_figure_type_name(f->type), fam ? fam->help : f->meaning);
		for (uint32_t k = 0; kvq_server_pool_info(s, k, &i) == 0; k++) {
			if (!fam) {
				sample(b, f->family, i.name, NULL, f->value(&i));
				continue;
			}
			for (size_t q = r; q < kvq_figures_n; q++) {
				const struct kvq_figure *g = &kvq_figures[q];

				if (!g->family || strcmp(g->family, f->family))
					continue;
				snprintf(extra, sizeof(extra), "%s=\"%s\"", fam->key, g->label);
				sample(b, f->family, i.name, extra, g->value(&i));
			}
		}
	}
}

/* NAME_bucket{LABELS,le="..."} cumulative, +Inf, NAME_sum, NAME_count:
 * bucket[n] counts per bound le[n] (not cumulative), count all of them. */
static void histogram(struct evbuffer *b, const char *name, const char *labels, const double *le, size_t n,
		      const uint64_t *bucket, uint64_t count, double sum)
{
	uint64_t cum = 0;

	for (size_t j = 0; j < n; j++) {
		cum += bucket[j];
		evbuffer_add_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, le[j], (unsigned long long)cum);
	}
	evbuffer_add_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels,
			    (unsigned long long)count, name, labels, sum, name, labels, (unsigned long long)count);
}

/* A reply status as a label: the errno's name, the project's code's, or the
 * number. */
static const char *status_name(int code, char *buf, size_t len)
{
	const char *s = NULL;

	if (code == KVQ_SERVER_ERR_OTHER)
		s = "other";
	else if (code == KVQ_ELAYOUT)
		s = "KVQ_ELAYOUT";
	else if (code == KVQ_EPOLICY)
		s = "KVQ_EPOLICY";
	else if (code < 0 && code > -KVQ_EBASE)
		s = strerrorname_np(-code);
	if (s)
		return s;
	snprintf(buf, len, "%d", code);
	return buf;
}

/* Error replies by request and status. */
static void write_errors(kvq_server *s, struct evbuffer *b)
{
	const char *req;
	char buf[16];
	uint64_t n;
	int code;

	family(b, "kvq_request_errors_total", "counter", "Error replies, by request type and status (an envelope "
	       "that does not parse counts as request other).");
	for (size_t row = 0; kvq_server_latency(s, row, NULL); row++)
		for (size_t i = 0; kvq_server_request_errors(s, row, i, &req, &code, &n) == 0; i++)
			evbuffer_add_printf(b, "kvq_request_errors_total{request=\"%s\",code=\"%s\"} %llu\n", req,
					    status_name(code, buf, sizeof(buf)), (unsigned long long)n);
}

/* Totals per device (backend and device ordinal; host: -1): its pools,
 * their capacity, the bytes of their slots in use, the device's memory. */
static void write_devices(kvq_server *s, struct evbuffer *b)
{
	struct dev {
		const char *backend;
		int device;
		uint64_t pools, capacity, used, memory;
	} d[64];
	struct kvq_pools_info i;
	size_t n = 0;

	for (uint32_t k = 0; kvq_server_pool_info(s, k, &i) == 0; k++) {
		size_t j = 0;

		while (j < n && (d[j].device != i.device || strcmp(d[j].backend, i.backend)))
			j++;
		if (j == n) {
			if (n == sizeof(d) / sizeof(d[0]))
				continue;   /* more devices than any host has: the rest untold */
			d[n++] = (struct dev){ .backend = i.backend, .device = i.device, .memory = i.device_memory };
		}
		d[j].pools++;
		d[j].capacity += i.total_bytes;
		d[j].used += ((uint64_t)i.st.sealed_private + i.st.sealed_cached + i.st.sealed_reserved) *
				     i.sealed_block_bytes +
			     ((uint64_t)i.st.open_used + i.st.sink_private + i.st.sink_cached) * i.open_block_bytes;
	}
	static const struct {
		const char *name, *help;
		size_t off;
	} rows[] = {
		{ "kvq_device_pools", "Allocated pools on the device (backend, device: -1 for host).",
		  offsetof(struct dev, pools) },
		{ "kvq_device_capacity_bytes", "Bytes of the pools on the device.", offsetof(struct dev, capacity) },
		{ "kvq_device_used_bytes", "Bytes of those pools' slots in use (sealed held, cached, reserved; open used; "
		  "sink held, cached).",
		  offsetof(struct dev, used) },
		{ "kvq_device_memory_bytes", "Memory of the device (host: physical memory).", offsetof(struct dev, memory) },
	};
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		family(b, rows[r].name, "gauge", rows[r].help);
		for (size_t j = 0; j < n; j++)
			evbuffer_add_printf(b, "%s{backend=\"%s\",device=\"%d\"} %llu\n", rows[r].name, d[j].backend,
					    d[j].device,
					    (unsigned long long)*(const uint64_t *)((const char *)&d[j] + rows[r].off));
	}
}

/* Pool name's label (escaped) and extra labels after it into labels[len],
 * built in lb. */
static void pool_labels(struct evbuffer *lb, const char *name, const char *extra, char *labels, size_t len)
{
	size_t n;

	evbuffer_drain(lb, evbuffer_get_length(lb));
	evbuffer_add_printf(lb, "pool=\"");
	label(lb, name);
	evbuffer_add_printf(lb, "\"%s", extra);
	n = evbuffer_get_length(lb);
	n = n < len - 1 ? n : len - 1;
	evbuffer_copyout(lb, labels, n);
	labels[n] = 0;
}

/* The attention timings of the pools that time. */
static void write_pool_work(kvq_server *s, struct evbuffer *b)
{
	struct kvq_pools_info i;
	char labels[256];
	struct evbuffer *lb;

	family(b, "kvq_attention_bins_total", "counter", "Bins of attention reports: taken as sent, clamped to what "
	       "kvqd can believe, or dropped.");
	for (uint32_t k = 0; kvq_server_pool_info(s, k, &i) == 0; k++) {
		const uint64_t bins[] = { i.attn->bins_taken, i.attn->bins_clamped, i.attn->bins_dropped };
		static const char *const res[] = { "taken", "clamped", "dropped" };

		samples(b, "kvq_attention_bins_total", i.name, "result", res, bins, 3);
	}
	lb = evbuffer_new();
	for (int fam = 0; lb && fam < 2; fam++) {
		if (fam == 0)
			family(b, "kvq_attention_seconds", "histogram", "Attention calls libkvq timed, by pool, phase "
			       "(decode: one query token; prefill) and K and V format (kvqd.conf attention_timing).");
		else
			family(b, "kvq_attention_kv_bytes_total", "counter", "KV bytes the timed attention calls read "
			       "(their blocks of the layer): bytes per second compare across pools and contexts.");
		for (uint32_t k = 0; kvq_server_pool_info(s, k, &i) == 0; k++) {
			if (!i.attention_report_ms)
				continue;
			for (uint32_t h = 0; h < i.attn->n; h++) {
				const struct kvq_attn_hist *x = &i.attn->h[h];
				char extra[128];

				snprintf(extra, sizeof(extra), ",phase=\"%s\",k=\"%s\",v=\"%s\"",
					 kvq_attn_phase_name(x->phase), kvq_fmt_name(x->kfmt), kvq_fmt_name(x->vfmt));
				pool_labels(lb, i.name, extra, labels, sizeof(labels));
				if (fam == 0)
					histogram(b, "kvq_attention_seconds", labels, kvq_timing_le, KVQ_TIMING_BUCKETS,
						  x->bucket, x->count, x->seconds);
				else
					evbuffer_add_printf(b, "kvq_attention_kv_bytes_total{%s} %llu\n", labels,
							    (unsigned long long)x->kv_bytes);
			}
		}
	}
	evbuffer_free(lb);
}

/* A histogram family of the pools: fam with help, one set of samples per
 * pool that has one (h gives it, or NULL). */
static void write_pool_hist(kvq_server *s, struct evbuffer *b, const char *fam, const char *help,
			    const struct kvq_hist *(*h)(const struct kvq_pools_info *i))
{
	struct kvq_pools_info i;
	struct evbuffer *lb = evbuffer_new();
	char labels[256];

	family(b, fam, "histogram", help);
	for (uint32_t k = 0; lb && kvq_server_pool_info(s, k, &i) == 0; k++) {
		const struct kvq_hist *x = h(&i);

		if (!x)
			continue;
		pool_labels(lb, i.name, "", labels, sizeof(labels));
		histogram(b, fam, labels, kvq_hist_bucket_le, KVQ_HIST_BUCKETS, x->bucket, x->count, x->sum);
	}
	if (lb)
		evbuffer_free(lb);
}

/* The time of each pool's host-tier copy jobs (pools with a tier). */
static const struct kvq_hist *tier_copy_time(const struct kvq_pools_info *i)
{
	return i->tier.tier.capacity ? &i->tier.copy_time : NULL;
}

/* The time of each pool's remote fetches (pools with a remote tier). */
static const struct kvq_hist *remote_fetch_time(const struct kvq_pools_info *i)
{
	return i->remote.on ? &i->remote.fetch_time : NULL;
}

/* The counters of what the limits did (KVQ_SERVER_COUNTERS). */
static void write_counters(kvq_server *s, struct evbuffer *b)
{
	const char *fam, *label, *help;
	uint64_t v;

	for (int i = 0; kvq_server_counter(s, i, &v, &fam, &label, &help) == 0; i++) {
		if (help)
			family(b, fam, "counter", help);
		if (label)
			evbuffer_add_printf(b, "%s{%s} %llu\n", fam, label, (unsigned long long)v);
		else
			evbuffer_add_printf(b, "%s %llu\n", fam, (unsigned long long)v);
	}
}

static void write_metrics(kvq_server *s, struct evbuffer *b)
{
	const struct kvq_hist *h;
	const char *name;
	uint32_t live, exiting;

	family(b, "kvq_build_info", "gauge", "kvqd's version (the value is 1).");
	evbuffer_add_printf(b, "kvq_build_info{version=\"%s\"} 1\n", PACKAGE_VERSION);
	kvq_server_connections(s, &live, &exiting);
	family(b, "kvq_connections", "gauge", "Client connections: live, or closed with an exiting peer's lease kept.");
	evbuffer_add_printf(b, "kvq_connections{state=\"live\"} %u\nkvq_connections{state=\"exiting\"} %u\n", live,
			    exiting);

	family(b, "kvq_connections_max", "gauge", "The connection limit now: max_connections, or fewer when the "
	       "file descriptor limit allows fewer.");
	evbuffer_add_printf(b, "kvq_connections_max %u\n", kvq_server_max_connections(s));
	write_counters(s, b);

	write_figures(s, b);
	write_pool_work(s, b);
	write_pool_hist(s, b, "kvq_tier_copy_seconds", "Copy jobs of each pool's host tier (a demotion batch or a "
			"lookup's promotion) by their time on kvqd's copy thread.", tier_copy_time);
	write_pool_hist(s, b, "kvq_remote_fetch_seconds", "Fetches from each pool's remote tier (a lookup's GETs, "
			"sent until each value was verified and unpacked or refused) by their time.", remote_fetch_time);
	write_devices(s, b);

	family(b, "kvq_request_duration_seconds", "histogram",
	       "Time from a request's arrival to its reply being queued, by request type.");
	for (size_t r = 0; (h = kvq_server_latency(s, r, &name)); r++) {
		char labels[64];

		snprintf(labels, sizeof(labels), "request=\"%s\"", name);
		histogram(b, "kvq_request_duration_seconds", labels, kvq_hist_bucket_le, KVQ_HIST_BUCKETS, h->bucket,
			  h->count, h->sum);
	}
	write_errors(s, b);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	kvq_metrics *m = arg;
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	struct evbuffer *b;

	if (!path || strcmp(path, "/metrics")) {
		evhttp_send_error(req, HTTP_NOTFOUND, "kvqd serves /metrics only");
		return;
	}
	b = evbuffer_new();
	if (!b) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	write_metrics(m->server, b);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4; charset=utf-8");
	evhttp_send_reply(req, HTTP_OK, "OK", b);
	evbuffer_free(b);
}

int kvq_metrics_new(struct event_base *base, struct kvq_server *server, const char *listen, kvq_metrics **ret,
		    char *err, size_t errlen)
{
	char addr[KVQ_CONFIG_LISTEN_MAX + 1];
	kvq_metrics *m;
	uint16_t port;
	int r;

	r = kvq_config_parse_listen(listen, addr, sizeof(addr), &port, err, errlen);
	if (r < 0)
		return r;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->server = server;
	m->http = evhttp_new(base);
	if (!m->http) {
		free(m);
		return kvq_seterr(err, errlen, "metrics: cannot create the HTTP server"), -ENOMEM;
	}
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_max_headers_size(m->http, METRICS_MAX_HEADERS);
	evhttp_set_max_body_size(m->http, 0);
	evhttp_set_timeout(m->http, METRICS_TIMEOUT_S);
	evhttp_set_gencb(m->http, on_request, m);
	if (evhttp_bind_socket(m->http, addr, port) < 0) {
		r = errno ? -errno : -EADDRNOTAVAIL;
		kvq_seterr(err, errlen, "metrics: cannot listen on %s: %s", listen, strerror(-r));
		kvq_metrics_free(m);
		return r;
	}
	*ret = m;
	return 0;
}

void kvq_metrics_free(kvq_metrics *m)
{
	if (!m)
		return;
	if (m->http)
		evhttp_free(m->http);
	free(m);
}
