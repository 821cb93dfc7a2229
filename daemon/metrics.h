/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prometheus metrics of kvqd: the text exposition format (version 0.0.4)
 * at GET /metrics on a loopback TCP address (kvqd.conf metrics_listen),
 * served by libevent's HTTP server on the daemon's loop.  Opt-in: without
 * metrics_listen nothing listens.  Loopback only, because the metrics name
 * pools and models and the endpoint has no authentication; a scraper on
 * another host goes through a local agent or a proxy that adds it.
 */
#ifndef KVQD_METRICS_H
#define KVQD_METRICS_H

#include <stddef.h>

#include <event2/event.h>

typedef struct kvq_metrics kvq_metrics;
struct kvq_server;

/*
 * Listens on listen ("127.0.0.1:9464", "[::1]:9464"; checked by
 * kvq_config_parse_listen) and serves the metrics of server on base.
 * Returns 0 and *ret, or a negative errno with a reason in err.
 */
int kvq_metrics_new(struct event_base *base, struct kvq_server *server, const char *listen, kvq_metrics **ret,
		    char *err, size_t errlen);

/* Stops listening and frees; NULL is fine. */
void kvq_metrics_free(kvq_metrics *m);

#endif
