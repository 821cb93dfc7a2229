/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
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

void kvq_log(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n, saved = errno;

	if (level > log_level)
		return;
	n = snprintf(line, sizeof(line), "<%d>", level);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	n = (int)strlen(line);
	line[n++] = '\n';
	/* one write per line so that concurrent writers do not interleave */
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}
