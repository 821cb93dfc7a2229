/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A main for a fuzz target without libFuzzer, for make check: each file of
 * the committed corpus (tests/fuzz/corpus/FUZZ_CORPUS, or the directories
 * and files given as arguments) through the target once, a TAP line each.
 * A target's assertion aborts, so a failure is a crash of this test.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../tap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
	uint8_t *buf = NULL;
	long n;
	FILE *f = fopen(path, "rb");
	int r = -1;

	if (!f)
		return -1;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc(n ? (size_t)n : 1);
		if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
			LLVMFuzzerTestOneInput(buf, (size_t)n);
			r = 0;
		}
	}
	free(buf);
	fclose(f);
	return r;
}

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir, in name order; returns how many. */
static int run_dir(const char *dir)
{
	char *names[1024], path[4096];
	struct dirent *de;
	size_t n = 0;
	DIR *d = opendir(dir);

	if (!d) {
		ok(0, "%s: %s", dir, strerror(errno));
		return 0;
	}
	while ((de = readdir(d)) && n < sizeof(names) / sizeof(names[0]))
		if (de->d_name[0] != '.')
			names[n++] = strdup(de->d_name);
	closedir(d);
	qsort(names, n, sizeof(names[0]), cmp);
	for (size_t i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		ok(run_file(path) == 0, "%s", path);
		free(names[i]);
	}
	return (int)n;
}

int main(int argc, char **argv)
{
	const char *top = getenv("top_srcdir");
	char dir[4096];
	int n = 0;

	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	if (argc > 1) {
		for (int i = 1; i < argc; i++) {
			struct stat sb;

			if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode))
				n += run_dir(argv[i]);
			else
				ok(run_file(argv[i]) == 0, "%s", argv[i]), n++;
		}
	} else {
		snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s", top ? top : ".", FUZZ_CORPUS);
		n = run_dir(dir);
	}
	ok(n > 0, "%d inputs, each through the target without a failed check", n);
	return done_testing();
}
