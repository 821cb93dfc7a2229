/* SPDX-License-Identifier: Apache-2.0 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>

#include "sd.h"

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

int kvq_sd_listen_fd(int *ret_fd)
{
	int n = sd_listen_fds(1);

	if (n <= 0)
		return n;
	if (n > 1)
		return -E2BIG;
	if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0)
		return -ENOTSOCK;
	*ret_fd = SD_LISTEN_FDS_START;
	return 1;
}

void kvq_sd_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void kvq_sd_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

void kvq_sd_reloading(void)
{
	sd_notify(0, "RELOADING=1");
}

void kvq_sd_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}

void kvq_sd_watchdog(void)
{
	sd_notify(0, "WATCHDOG=1");
}

uint64_t kvq_sd_watchdog_usec(void)
{
	uint64_t usec = 0;

	return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

#else

int kvq_sd_listen_fd(int *ret_fd)
{
	return 0;
}

void kvq_sd_ready(const char *status)
{
}

void kvq_sd_status(const char *status)
{
}

void kvq_sd_reloading(void)
{
}

void kvq_sd_stopping(void)
{
}

void kvq_sd_watchdog(void)
{
}

uint64_t kvq_sd_watchdog_usec(void)
{
	return 0;
}

#endif
