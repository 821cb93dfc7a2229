/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf's schema as data (conf_schema.c): the rows and section kinds of
 * conf_keys.h as tables the reader, the checks and a reload walk.
 */
#ifndef KVQD_CONF_SCHEMA_H
#define KVQD_CONF_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf_keys.h"

struct kvq_config;

/* A row as data. */
struct conf_schema_key {
	const char *name;
	int sec;                /* enum kvq_conf_section */
	int type;               /* enum kvq_conf_type */
	size_t offset, size;    /* of the field in the section's struct */
	uint64_t lo, hi, step;
	const char *def;
	unsigned flags;         /* KVQ_CONF_RELOAD, _REQUIRED, _INHERIT */
	const char *what;
};
extern const struct conf_schema_key conf_schema_keys[K_COUNT];

/* A section kind as data. */
struct conf_schema_section {
	const char *word;
	bool named;
	size_t items, n_items;  /* offsets in struct kvq_config (named kinds) */
	uint32_t max;
	size_t size;            /* of its struct */
};
extern const struct conf_schema_section conf_schema_sections[KVQ_CONF_SEC_COUNT];

/* The row called name in section kind sec, or -1. */
int conf_schema_find(int sec, const char *name);

/* The row that shares row k's field (the other of an AMOUNT/SHARE pair),
 * or -1. */
int conf_schema_twin(int k);

/* Whether row k's type keeps its value in a field of its own (GIDS and
 * SHARE rows share the row before them's). */
bool conf_schema_owns_field(int k);

/* The kinds as a header list for messages: "kvqd or pool NAME". */
const char *conf_schema_section_list(void);

/* Named section idx of kind sec in c (its struct), or NULL past the end. */
void *conf_schema_item(const struct kvq_config *c, int sec, uint32_t idx);

/* What a reload (SIGHUP) may change: the running config's value of each
 * key whose row is not KVQ_CONF_RELOAD, in [kvqd] and in the named sections
 * that both configs hold, is put back into next, and note(arg, word, name,
 * key) is called for each that differed (name NULL for [kvqd]); the
 * remotes' secrets are kept too (kvq_config_keep_secrets). */
void kvq_config_keep_running(const struct kvq_config *running, struct kvq_config *next,
			     void (*note)(void *arg, const char *word, const char *name, const char *key), void *arg);

#endif
