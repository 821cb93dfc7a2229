/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd "nodes" sharing a remote tier through the test's Redis Cluster
 * (tests/redis_cluster.h), for the remote tier's tests of write-back
 * (test_remote_back) and of tensor-parallel groups (test_remote_group):
 * a node's kvqd with a [remote shared] section of that cluster, its
 * pools' figures, the cluster's kvq keys.  Include after tap.h, daemon.h,
 * redis_cluster.h and prompts.h.
 */
#ifndef KVQ_TEST_REMOTE_NODES_H
#define KVQ_TEST_REMOTE_NODES_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct node {
	const char *tag;
	pid_t pid;
	char dir[64], sock[108], bin[256];
};

/* Node n with the [kvqd] lines globals, the remote "shared" (seeded with
 * the cluster's first two nodes) and the kvqd.conf sections conf (its
 * pools). */
__attribute__((unused))
static bool node_up(struct node *n, const char *globals, const char *conf)
{
	char extra[4096];

	snprintf(extra, sizeof extra,
		 "host_tier_wait_ms = 3000\n%s"
		 "[remote shared]\nnodes = 127.0.0.1:%d,127.0.0.1:%d\nuser = " ACL_USER "\n"
		 "password_file = %s/password\nhmac_key_file = %s/hmac\nrequest_timeout_ms = 500\n"
		 "connect_timeout_ms = 300\n%s",
		 globals, ports[0], ports[1], secrets, secrets, conf);
	n->pid = test_daemon_start_conf("host", n->tag, extra, n->dir, sizeof n->dir, n->sock, sizeof n->sock, n->bin,
					sizeof n->bin);
	return n->pid > 0;
}

__attribute__((unused))
static void node_down(struct node *n)
{
	if (n->pid > 0)
		test_daemon_stop(n->pid, n->dir);
	n->pid = 0;
}

/* Waits (up to ms) until c's pool wrote at least want blocks and its
 * queue is empty. */
__attribute__((unused))
static bool node_written(kvq_client *c, uint64_t want, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (prompt_figure(c, "remote_written") >= want && prompt_figure(c, "remote_queue") == 0)
			return true;
		usleep(10000);
	}
	return false;
}

/* The cluster's kvq keys (up to max) into out[][256]: how many. */
__attribute__((unused))
static int cluster_keys(char (*out)[256], int max)
{
	int m[3], nm = masters(m, 3), n = 0;

	for (int i = 0; i < nm; i++) {
		redisReply *r = admin(m[i], "KEYS kvq:*");

		for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements && n < max; k++)
			snprintf(out[n++], 256, "%s", r->element[k]->str);
		freeReplyObject(r);
	}
	return n;
}

/* Every slot of c's pool accounted for, nothing held. */
__attribute__((unused))
static void node_accounted(kvq_client *c, const char *what)
{
	uint64_t n = prompt_figure(c, "n_sealed"), fr = prompt_figure(c, "sealed_free"),
		 ca = prompt_figure(c, "cached"), he = prompt_figure(c, "sealed_held"),
		 re = prompt_figure(c, "sealed_reserved"), rf = prompt_figure(c, "referenced");

	ok(n != UINT64_MAX && fr + ca + he + re == n && he == 0 && re == 0 && rf == 0,
	   "%s: every slot accounted for: %llu sealed = %llu free + %llu cached, none held, reserved or referenced",
	   what, (unsigned long long)n, (unsigned long long)fr, (unsigned long long)ca);
}

#endif
