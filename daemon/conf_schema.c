/* SPDX-License-Identifier: Apache-2.0 */
/* kvqd.conf's schema as data (the rows of conf_keys.h) and what a reload
 * keeps of the running config. */
#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "conf_schema.h"
#include "frame.h"
#include "kvq_wire.h"
#include "layout.h"

#define KVQ_CONF_SINGLE ((size_t)-1)
#define KVQ_CONF_ITEMS(f) offsetof(struct kvq_config, f)

const struct conf_schema_key conf_schema_keys[K_COUNT] = {
#define ROW(sec, key, type, field, lo, hi, step, def, flags, what) \
	[K_##sec##_##key] = { #key, KVQ_CONF_SEC_##sec, KVQ_CONF_T_##type, offsetof(KVQ_CONF_STRUCT_##sec, field), \
			      sizeof(((KVQ_CONF_STRUCT_##sec *)0)->field), lo, hi, step, def, flags, what },
	KVQ_CONF_KEYS(ROW)
#undef ROW
};

const struct conf_schema_section conf_schema_sections[KVQ_CONF_SEC_COUNT] = {
#define SECTION(id, word, items, n_items, max, init, check) \
	[KVQ_CONF_SEC_##id] = { word, items != KVQ_CONF_SINGLE, items, n_items, max, sizeof(KVQ_CONF_STRUCT_##id) },
	KVQ_CONF_SECTIONS(SECTION)
#undef SECTION
};

_Static_assert(offsetof(struct kvq_config_pool, name) == offsetof(struct kvq_config_named, name) &&
	       offsetof(struct kvq_config_pool, line) == offsetof(struct kvq_config_named, line),
	       "a named section's struct starts with KVQ_CONFIG_NAMED_HEAD");
_Static_assert(offsetof(struct kvq_config_remote, name) == offsetof(struct kvq_config_named, name) &&
	       offsetof(struct kvq_config_remote, line) == offsetof(struct kvq_config_named, line),
	       "a named section's struct starts with KVQ_CONFIG_NAMED_HEAD");

int conf_schema_find(int sec, const char *name)
{
	for (int k = 0; k < K_COUNT; k++)
		if (conf_schema_keys[k].sec == sec && strcmp(conf_schema_keys[k].name, name) == 0)
			return k;
	return -1;
}

bool conf_schema_owns_field(int k)
{
	int t = conf_schema_keys[k].type;

	return t != KVQ_CONF_T_GIDS && t != KVQ_CONF_T_SHARE;
}

int conf_schema_twin(int k)
{
	const struct conf_schema_key *r = &conf_schema_keys[k];

	for (int j = 0; j < K_COUNT; j++)
		if (j != k && conf_schema_keys[j].sec == r->sec && conf_schema_keys[j].offset == r->offset)
			return j;
	return -1;
}

const char *conf_schema_section_list(void)
{
	static char list[256];
	size_t n = 0;

	if (list[0])
		return list;
	for (int s = 0; s < KVQ_CONF_SEC_COUNT; s++)
		n += (size_t)snprintf(list + n, sizeof list - n, "%s%s%s",
				      s == 0 ? "" : s + 1 == KVQ_CONF_SEC_COUNT ? " or " : ", ",
				      conf_schema_sections[s].word, conf_schema_sections[s].named ? " NAME" : "");
	return list;
}

void *conf_schema_item(const struct kvq_config *c, int sec, uint32_t idx)
{
	const struct conf_schema_section *s = &conf_schema_sections[sec];
	char *items;

	if (!s->named)
		return idx == 0 ? (void *)c : NULL;
	if (idx >= *(const uint32_t *)((const char *)c + s->n_items))
		return NULL;
	memcpy(&items, (const char *)c + s->items, sizeof items);
	return items + (size_t)idx * s->size;
}

/* Row k's field back to its running value, noted when it differed. */
static void keep(int k, const void *running, void *next, const char *name,
		 void (*note)(void *, const char *, const char *, const char *), void *arg)
{
	const struct conf_schema_key *r = &conf_schema_keys[k];

	if ((r->flags & KVQ_CONF_RELOAD) || !conf_schema_owns_field(k))
		return;
	if (memcmp((const char *)running + r->offset, (const char *)next + r->offset, r->size) == 0)
		return;
	memcpy((char *)next + r->offset, (const char *)running + r->offset, r->size);
	if (note)
		note(arg, conf_schema_sections[r->sec].word, name, r->name);
}

void kvq_config_keep_running(const struct kvq_config *running, struct kvq_config *next,
			     void (*note)(void *arg, const char *word, const char *name, const char *key), void *arg)
{
	for (int sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++) {
		void *item;

		if (!conf_schema_sections[sec].named) {
			for (int k = 0; k < K_COUNT; k++)
				if (conf_schema_keys[k].sec == sec)
					keep(k, running, next, NULL, note, arg);
			continue;
		}
		/* a section new in next waits for the next start as a whole
		 * (logged where it is ignored) */
		for (uint32_t i = 0; (item = conf_schema_item(next, sec, i)); i++) {
			const struct kvq_config_named *n = item;
			const void *old = NULL, *o;

			for (uint32_t j = 0; !old && (o = conf_schema_item(running, sec, j)); j++)
				if (strcmp(((const struct kvq_config_named *)o)->name, n->name) == 0)
					old = o;
			for (int k = 0; old && k < K_COUNT; k++)
				if (conf_schema_keys[k].sec == sec)
					keep(k, old, item, n->name, note, arg);
		}
	}
	kvq_config_keep_secrets(running, next);
}
