/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster client's connections on the loop (daemon/rcluster.h): what
 * hiredis's libevent adapter does, without its costs on large replies.
 * The adapter's read event is one-shot and hiredis re-arms it after every
 * read (an epoll_ctl to remove it and one to add it back per wake-up), and
 * hiredis 0.14 reads 16 KiB at a time into a buffer on its stack that it
 * then copies into its reader: a 130 KiB value took nine wake-ups, eighteen
 * epoll_ctl calls and a copy of every byte before the reply's own.  Here
 * the events persist while hiredis wants them, and a readable socket is
 * read straight into the reader's buffer, as much as the reply at its head
 * still lacks (a bulk string's length is in its header), so that a value
 * comes in one or two reads and the reader discards no partial reply's
 * bytes after it (hiredis 0.14 only; a later hiredis reads as it does).
 */
#ifndef KVQD_RCONN_H
#define KVQD_RCONN_H

struct event_base;
struct redisAsyncContext;

/* Attaches ac to base (in place of redisLibeventAttach).  Returns 0, or -1
 * (ac already attached, no memory). */
int kvq_rconn_attach(struct redisAsyncContext *ac, struct event_base *base);

#endif
