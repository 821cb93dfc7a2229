/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_level = LOG_INFO;

void kvq_log_set_level(int level)
{
	if (level >= LOG_EMERG && level <= LOG_DEBUG)
		log_level = level;
}

int kvq_log_level_from_name(const char *s)
{
	static const char *const names[] = { "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug" };

	if (s[0] >= '0' && s[0] <= '7' && !s[1])
		return s[0] - '0';
	for (int i = 0; i < 8; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

static void log_line(int level, unsigned long dropped, const char *fmt, va_list ap)
{
	char line[1024];
	int n, saved = errno;

	n = snprintf(line, sizeof(line), "<%d>", level);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	n = (int)strlen(line);
	if (dropped)
		snprintf(line + n, sizeof(line) - (size_t)n - 1, " (%lu like it dropped)", dropped);
	n = (int)strlen(line);
	line[n++] = '\n';
	/* one write per line so that concurrent writers do not interleave */
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}

void kvq_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	log_line(level, 0, fmt, ap);
	va_end(ap);
}

void kvq_log_limited(struct kvq_log_limit *rl, int level, const char *fmt, ...)
{
	struct timespec now;
	va_list ap;

	if (level > log_level)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec - rl->window >= KVQ_LOG_INTERVAL_S) {
		rl->window = now.tv_sec;
		rl->n = 0;
	}
	if (rl->n >= KVQ_LOG_BURST) {
		rl->dropped++;
		return;
	}
	rl->n++;
	va_start(ap, fmt);
	log_line(level, rl->dropped, fmt, ap);
	va_end(ap);
	rl->dropped = 0;
}
