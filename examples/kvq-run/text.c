/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: text in and out: files read whole, text encoded to token ids,
 * a prompt in the chat template, FILE's tokens for the commands that score
 * it, and the tokenize command.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

char *read_file(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f)
		die("%s: %s", path, strerror(errno));
	do {
		if (cap - len < 65536) {
			cap = cap ? 2 * cap : 1 << 20;
			buf = realloc(buf, cap + 1);
			if (!buf)
				die("%s: %s", path, strerror(ENOMEM));
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	buf[len] = 0;
	*ret_len = len;
	return buf;
}

uint32_t *encode(const char *text, size_t len, int special, size_t *ret_n)
{
	uint32_t *ids;

	if (tok_encode(tk, text, len, special, &ids, ret_n) < 0)
		die("tokenize: %s", strerror(ENOMEM));
	return ids;
}

#define RUN_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

uint32_t *chat_tokens(const char *prompt, const char *system, size_t *ret_n)
{
	static const char fmt[] = "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
				  "<|im_start|>assistant\n";
	size_t len;
	char *text;
	uint32_t *ids;

	if (o.raw)
		return encode(prompt, strlen(prompt), 0, ret_n);
	if (!system)
		system = RUN_SYSTEM;
	len = sizeof(fmt) + strlen(system) + strlen(prompt);
	text = malloc(len);
	if (!text)
		die("%s", strerror(ENOMEM));
	snprintf(text, len, fmt, system, prompt);
	ids = encode(text, strlen(text), 1, ret_n);
	free(text);
	return ids;
}

int chat_stop(void)
{
	return tok_find(tk, "<|im_end|>");
}

uint32_t *file_tokens(size_t *ret_n)
{
	size_t len, n;
	char *text = read_file(o.file, &len);
	uint32_t *ids = encode(text, len, 0, &n);

	free(text);
	if (o.limit && n > o.limit)
		n = o.limit;
	if (n < 2)
		die("%s: fewer than 2 tokens", o.file);
	*ret_n = n;
	return ids;
}

int cmd_tokenize(void)
{
	size_t n;
	uint32_t *ids;

	if (!o.prompt)
		die("tokenize needs TEXT");
	load();
	ids = encode(o.prompt, strlen(o.prompt), o.special, &n);
	for (size_t i = 0; i < n; i++) {
		if (o.decode) {
			char buf[256];
			int len = tok_decode(tk, ids[i], buf, sizeof(buf));

			fwrite(buf, 1, len < (int)sizeof(buf) ? (size_t)len : sizeof(buf) - 1, stdout);
		} else {
			printf("%s%u", i ? " " : "", ids[i]);
		}
	}
	if (!o.decode)
		printf("\n");
	free(ids);
	return 0;
}
