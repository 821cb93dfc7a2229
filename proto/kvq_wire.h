/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every peer of kvqd shares beyond kvq.proto: the project's status
 * codes (a reply's status is one of them or a negated errno value) with
 * their names, and where the socket is.  Installed beside kvq.h, which
 * includes it; the daemon, libkvq, kvqctl and kvq-bench all take these from
 * here.
 */
#ifndef KVQ_WIRE_H
#define KVQ_WIRE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Project error codes, beyond errno's. */
#define KVQ_EBASE 1000
enum {
	KVQ_ELAYOUT = -(KVQ_EBASE + 1),   /* layout version or geometry mismatch (on the wire) */
	KVQ_EPOLICY = -(KVQ_EBASE + 2),   /* bad KV policy string (on the wire) */
	KVQ_EPROTOCOL = -(KVQ_EBASE + 3), /* the daemon's reply broke the protocol (a client's finding, never sent) */
};

/* Static description of an error code (never NULL). */
const char *kvq_strerror(int err);

/* kvqd's socket for root (the systemd units' and kvqd.conf's default). */
#define KVQ_ROOT_SOCKET "/run/kvqd/kvqd.sock"

/* The socket libkvq, kvqctl and kvq-bench use when given none: $KVQ_SOCKET,
 * else KVQ_ROOT_SOCKET for root, else $XDG_RUNTIME_DIR/kvqd.sock (an
 * absolute XDG_RUNTIME_DIR, as kvqd takes it).  Returns 0 with the path in
 * buf, -ENOENT when none applies (a user without XDG_RUNTIME_DIR) or
 * -ENAMETOOLONG. */
int kvq_default_socket(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
