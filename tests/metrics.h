/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics endpoint for the integration tests: a free loopback port for
 * kvqd's metrics_listen, a GET, a strict reading of the text exposition
 * (format 0.0.4), one sample's value, kvqctl --json stats and a number of its
 * output.
 */
#ifndef KVQ_TEST_METRICS_H
#define KVQ_TEST_METRICS_H

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>


__attribute__((unused))
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* GET path on 127.0.0.1:port; the whole response (headers and body) into
 * buf.  Returns its length or -1. */
__attribute__((unused))
static ssize_t http_get(int port, const char *path, char *buf, size_t len)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char req[256];
	size_t got = 0;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -1;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (poll(&p, 1, 5000) <= 0)
			break;
		k = read(fd, buf + got, len - 1 - got);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	buf[got] = 0;
	return (ssize_t)got;
}

static bool metric_name(const char **p)
{
	const char *s = *p;

	if (!isalpha((unsigned char)*s) && *s != '_' && *s != ':')
		return false;
	while (isalnum((unsigned char)*s) || *s == '_' || *s == ':')
		s++;
	*p = s;
	return true;
}

/* A value: a float, +Inf, -Inf or NaN. */
static bool metric_value(const char *s)
{
	char *end;

	if (!strcmp(s, "+Inf") || !strcmp(s, "-Inf") || !strcmp(s, "NaN"))
		return true;
	strtod(s, &end);
	return end != s && *end == 0;
}

#define MAX_FAMILIES 128

/*
 * Parses a text exposition line by line (Prometheus text format 0.0.4):
 * "# HELP name text", "# TYPE name counter|gauge|histogram|summary|untyped",
 * and samples "name{label="value",...} value"; every sample belongs to a
 * family whose TYPE came first (histograms: _bucket, _sum, _count), each
 * family's samples are contiguous, and bucket counts never fall.  Returns
 * the number of samples, or -(line number) of the first bad line.
 */
__attribute__((unused))
static int parse_exposition(char *body)
{
	char fam[MAX_FAMILIES][96], type[MAX_FAMILIES][16], last[96] = "";
	int nfam = 0, samples = 0, line = 0;
	double prev_bucket = -1;

	for (char *save = NULL, *l = strtok_r(body, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		const char *p = l, *name;
		char base[96], value[64];
		int f = -1;
		size_t n;

		line++;
		if (!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7)) {
			bool is_type = l[2] == 'T';

			p = l + 7;
			name = p;
			if (!metric_name(&p) || *p != ' ' || (size_t)(p - name) >= sizeof(base))
				return -line;
			if (is_type) {
				const char *t = p + 1;

				if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
				    strcmp(t, "summary") && strcmp(t, "untyped"))
					return -line;
				if (nfam >= MAX_FAMILIES)
					return -line;
				for (int i = 0; i < nfam; i++)
					if (strlen(fam[i]) == (size_t)(p - name) && !strncmp(fam[i], name, (size_t)(p - name)))
						return -line;     /* a family declared twice */
				snprintf(fam[nfam], sizeof(fam[0]), "%.*s", (int)(p - name), name);
				snprintf(type[nfam], sizeof(type[0]), "%s", t);
				nfam++;
			}
			continue;
		}
		if (l[0] == '#')
			continue;
		name = p;
		if (!metric_name(&p) || (size_t)(p - name) >= sizeof(base))
			return -line;
		snprintf(base, sizeof(base), "%.*s", (int)(p - name), name);
		if (*p == '{') {
			p++;
			while (*p != '}') {
				const char *ln = p;

				if (!metric_name(&ln) || *ln != '=' || ln[1] != '"')
					return -line;
				p = ln + 2;
				while (*p && *p != '"') {
					if (*p == '\\') {
						if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
							return -line;
						p++;
					}
					p++;
				}
				if (*p != '"')
					return -line;
				p++;
				if (*p == ',')
					p++;
				else if (*p != '}')
					return -line;
			}
			p++;
		}
		if (*p != ' ')
			return -line;
		p++;
		n = strcspn(p, " ");
		if (n == 0 || n >= sizeof(value))
			return -line;
		snprintf(value, sizeof(value), "%.*s", (int)n, p);
		if (!metric_value(value))
			return -line;
		/* the family: the name itself, or a histogram's suffixed series */
		for (int i = 0; i < nfam && f < 0; i++) {
			size_t fl = strlen(fam[i]);

			if (!strcmp(base, fam[i]))
				f = i;
			else if (!strcmp(type[i], "histogram") && !strncmp(base, fam[i], fl) &&
				 (!strcmp(base + fl, "_bucket") || !strcmp(base + fl, "_sum") ||
				  !strcmp(base + fl, "_count")))
				f = i;
		}
		if (f < 0 || (f != nfam - 1))
			return -line;     /* no TYPE before it, or not contiguous with its family */
		if (strstr(base, "_bucket")) {
			double v = strtod(value, NULL);

			if (v < prev_bucket)
				return -line;
			prev_bucket = v;
		} else {
			prev_bucket = -1;     /* a series' _sum and _count end its buckets */
		}
		(void)last;
		samples++;
	}
	return samples;
}

/* The value of the sample line that starts with prefix (e.g.
 * 'kvq_evictions_total{pool="ctl"} '), or NAN. */
__attribute__((unused))
static double metric(const char *body, const char *prefix)
{
	const char *p = body;

	while ((p = strstr(p, prefix))) {
		if (p == body || p[-1] == '\n')
			return strtod(p + strlen(prefix), NULL);
		p++;
	}
	return NAN;
}


/* `ctl --socket sock --json stats pool` into out (n bytes); its exit status
 * as pclose gives it, -1 when it could not run. */
__attribute__((unused))
static int ctl_stats_json(const char *ctl, const char *sock, const char *pool, char *out, size_t n)
{
	char cmd[1024];
	size_t got;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --json stats %s", ctl, sock, pool);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	got = fread(out, 1, n - 1, f);
	out[got] = 0;
	return pclose(f);
}

/* The number after "key": at or after from in a JSON text, as kvqctl --json
 * writes it (NAN if none). */
__attribute__((unused))
static double jnum(const char *doc, const char *from, const char *key)
{
	char pat[96];
	const char *p = from ? strstr(doc, from) : doc;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	if (!p || !(p = strstr(p, pat)))
		return NAN;
	return strtod(p + strlen(pat), NULL);
}

#endif
