/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Codebooks (kernels/codebook.h): their size and offsets for mixed policies
 * against counts worked out by hand; files written for real policies and
 * parsed back, every field, byte for byte against the layout kvq-codebook(5)
 * describes; a write through a slow pipe with signals (short writes, EINTR);
 * refusals, each with its reason checked: every truncation, a byte too
 * many, magic, version, byte order, each header field out of range, sizes
 * that lie, geometry and formats that do not fit the pool, NaN and
 * infinities named by their place.  A refused parse leaves *ret alone.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codebook.h"
#include "../tap.h"

/* ------------------------------------------------------------- helpers */

static void policy(const char *s, uint32_t layers, struct kvq_policy *p)
{
	char err[256];

	if (kvq_policy_parse(s, layers, p, err, sizeof err) != 0) {
		fprintf(stderr, "test policy '%s': %s\n", s, err);
		abort();
	}
}

static uint32_t rd32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void wr32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *b, uint64_t v)
{
	wr32(b, (uint32_t)v);
	wr32(b + 4, (uint32_t)(v >> 32));
}

static void swap_bytes(uint8_t *b, int n)
{
	for (int i = 0; i < n / 2; i++) {
		uint8_t t = b[i];
		b[i] = b[n - 1 - i];
		b[n - 1 - i] = t;
	}
}

/* Random finite FP16 centroids. */
static uint16_t *random_data(uint64_t bytes)
{
	uint16_t *d = malloc(bytes);

	if (!d)
		abort();
	for (uint64_t i = 0; i < bytes / 2; i++)
		d[i] = kvq_f16_from_f32((float)(tap_normal() * 3.0));
	return d;
}

/* The whole content of fd from offset 0. */
static uint8_t *slurp(int fd, size_t *ret_len)
{
	size_t cap = 1 << 16, len = 0;
	uint8_t *b = malloc(cap);
	ssize_t r;

	if (!b || lseek(fd, 0, SEEK_SET) != 0)
		abort();
	while ((r = read(fd, b + len, cap - len)) > 0) {
		len += (size_t)r;
		if (len == cap) {
			uint8_t *nb = realloc(b, cap *= 2);

			if (!nb)
				abort();
			b = nb;
		}
	}
	*ret_len = len;
	return b;
}

/* A file written by kvq_codebook_write into a memfd; NULL when it fails. */
static uint8_t *write_file(const struct kvq_policy *p, uint32_t H, uint32_t D, uint32_t transforms,
			   const uint16_t *data, size_t *ret_len, int *ret_rc)
{
	int fd = memfd_create("kvq-test-codebook", MFD_CLOEXEC);
	uint8_t *img;

	if (fd < 0)
		abort();
	*ret_rc = kvq_codebook_write(fd, p, H, D, transforms, data, kvq_codebook_bytes(p, H, D));
	img = *ret_rc == 0 ? slurp(fd, ret_len) : NULL;
	close(fd);
	return img;
}

/* The image parses, refused; the message holds every one of the words
 * (NULL-terminated), and *ret is left alone. */
static void refused(const uint8_t *img, size_t len, const struct kvq_policy *want, uint32_t H, uint32_t D,
		    const char *what, const char *const *words)
{
	struct kvq_cb_file out, before;
	char err[512] = "";
	int rc, has = 1;

	memset(&out, 0xa5, sizeof out);
	memcpy(&before, &out, sizeof out);
	rc = kvq_codebook_parse(img, len, want, H, D, &out, err, sizeof err);
	for (int i = 0; words[i]; i++)
		has &= strstr(err, words[i]) != NULL;
	ok(rc == -EINVAL && has && memcmp(&out, &before, sizeof out) == 0, "refused: %s (%s)", what, err);
}

#define REFUSED(img, len, want, H, D, what, ...) \
	refused(img, len, want, H, D, what, (const char *const[]){ __VA_ARGS__, NULL })

/* ------------------------------------------------- sizes and offsets */

static void test_sizes(void)
{
	struct kvq_policy p;
	/* 256 centroids x H=2 heads x D=32 values x 2 bytes: 32768 per
	 * (layer, K or V) whatever the subspace dim */
	const uint64_t part = 32768, none = UINT64_MAX;

	/* layer 0: pq1 K and V; layers 1, 2: pq2 K, kivi2 V.  In order:
	 * (0,K) at 0, (0,V) at 1 part, (1,K) at 2, (2,K) at 3; 4 parts */
	policy("0:pq1;1-:k=pq2,v=kivi2", 3, &p);
	ok(kvq_codebook_bytes(&p, 2, 32) == 4 * part, "0:pq1;1-:k=pq2,v=kivi2: %llu bytes of codebooks (131072)",
	   (unsigned long long)kvq_codebook_bytes(&p, 2, 32));
	ok(kvq_codebook_off(&p, 2, 32, 0, 0) == 0 && kvq_codebook_off(&p, 2, 32, 0, 1) == part &&
	   kvq_codebook_off(&p, 2, 32, 1, 0) == 2 * part && kvq_codebook_off(&p, 2, 32, 1, 1) == none &&
	   kvq_codebook_off(&p, 2, 32, 2, 0) == 3 * part && kvq_codebook_off(&p, 2, 32, 2, 1) == none,
	   "0:pq1;1-:k=pq2,v=kivi2: offsets 0, 32768, 65536, none, 98304, none");
	ok(kvq_codebook_off(&p, 2, 32, 3, 0) == none && kvq_codebook_off(&p, 2, 32, 3, 1) == none,
	   "no offset past the last layer");

	/* V only: (0,V) at 0, (1,V) at 1 part; H=8, D=128: 256*8*128*2 */
	policy("k=int8,v=pq2", 2, &p);
	ok(kvq_codebook_bytes(&p, 8, 128) == 2 * 524288ull && kvq_codebook_off(&p, 8, 128, 0, 0) == none &&
	   kvq_codebook_off(&p, 8, 128, 0, 1) == 0 && kvq_codebook_off(&p, 8, 128, 1, 1) == 524288,
	   "k=int8,v=pq2 H=8 D=128: 1048576 bytes, V of layer 1 at 524288");

	policy("0-1:int8;2:kivi2", 3, &p);
	ok(kvq_codebook_bytes(&p, 2, 32) == 0 && kvq_codebook_off(&p, 2, 32, 0, 0) == none,
	   "no codebook format: 0 bytes, no offsets");
}

/* ---------------------------------------------------------- round trip */

/* Writes the file of a policy and reads it back: header bytes at the
 * offsets of kvq-codebook(5), every parsed field, the data. */
static void round_trip(const char *pol, uint32_t layers, uint32_t H, uint32_t D, uint32_t transforms)
{
	struct kvq_policy p;
	struct kvq_cb_file f;
	char canon[KVQ_POLICY_MAX_LEN + 1], err[512] = "";
	uint64_t bytes, hdr;
	uint16_t *data;
	uint8_t *img;
	size_t len = 0;
	int rc, bad = 0, pad = 0;

	policy(pol, layers, &p);
	kvq_policy_format(&p, canon, sizeof canon);
	bytes = kvq_codebook_bytes(&p, H, D);
	data = random_data(bytes);
	img = write_file(&p, H, D, transforms, data, &len, &rc);
	ok(rc == 0, "%s: written (%d)", pol, rc);
	if (!img)
		goto out;
	hdr = 48 + 2 * layers + strlen(canon);
	ok(len == ((hdr + 15) & ~15ull) + bytes, "%s: %zu bytes: header %llu, padding to 16, %llu of data", pol, len,
	   (unsigned long long)hdr, (unsigned long long)bytes);
	ok(memcmp(img, "KVQCBOOK", 8) == 0 && rd32(img + 8) == 1 && rd32(img + 12) == 0x01020304 &&
	   rd32(img + 16) == layers && rd32(img + 20) == H && rd32(img + 24) == D && rd32(img + 28) == 256 &&
	   rd32(img + 32) == transforms && rd32(img + 36) == strlen(canon) &&
	   rd32(img + 40) == (uint32_t)bytes && rd32(img + 44) == (uint32_t)(bytes >> 32),
	   "%s: the fixed header, little-endian at its offsets", pol);
	for (uint32_t l = 0; l < layers; l++) {
		unsigned kd = p.k[l] == KVQ_FMT_PQ2 ? 4 : p.k[l] == KVQ_FMT_PQ1 ? 8 : 0;
		unsigned vd = p.v[l] == KVQ_FMT_PQ2 ? 4 : p.v[l] == KVQ_FMT_PQ1 ? 8 : 0;

		bad += img[48 + l] != kd || img[48 + layers + l] != vd;
	}
	for (uint64_t o = hdr; o < len - bytes; o++)
		pad += img[o] != 0;
	ok(bad == 0 && memcmp(img + 48 + 2 * layers, canon, strlen(canon)) == 0 && pad == 0,
	   "%s: subspace dims, the canonical policy '%s', zero padding", pol, canon);
	for (uint64_t i = 0; i < bytes / 2; i++)
		bad += img[len - bytes + 2 * i] != (data[i] & 0xff) || img[len - bytes + 2 * i + 1] != data[i] >> 8;
	ok(bad == 0, "%s: the data is the centroids, FP16 little-endian", pol);

	rc = kvq_codebook_parse(img, len, &p, H, D, &f, err, sizeof err);
	ok(rc == 0, "%s: parsed against its pool (%s)", pol, err);
	if (rc == 0) {
		for (uint32_t l = 0; l < layers; l++)
			bad += f.k_subdim[l] != img[48 + l] || f.v_subdim[l] != img[48 + layers + l];
		for (uint32_t l = layers; l < KVQ_MAX_LAYERS; l++)
			bad += f.k_subdim[l] != 0 || f.v_subdim[l] != 0;
		ok(f.layers == layers && f.kv_heads == H && f.head_dim == D && f.transforms == transforms &&
		   bad == 0 && strcmp(f.policy, canon) == 0, "%s: layers, heads, head dim, transforms, subspace dims, "
		   "policy", pol);
		ok(f.data == img + (len - bytes) && f.data_bytes == bytes &&
		   memcmp(f.data, img + len - bytes, bytes) == 0, "%s: data points into the image, %llu bytes",
		   pol, (unsigned long long)f.data_bytes);
	}
	rc = kvq_codebook_parse(img, len, NULL, 0, 0, &f, err, sizeof err);
	ok(rc == 0 && f.layers == layers, "%s: parsed without a pool (%s)", pol, err);
	free(img);
out:
	free(data);
}

/* ---------------------------------------------- write: short writes, EINTR */

static void on_alarm(int sig)
{
	(void)sig;
}

/* The file written by a child into a pipe that this process reads slowly,
 * while a timer interrupts the child's writes every 100 us. */
static void test_pipe(void)
{
	struct kvq_policy p;
	uint16_t *data;
	uint8_t *want, *got;
	size_t want_len = 0, cap, len = 0;
	int fds[2], rc, status = 0, reads = 0;
	pid_t pid;
	ssize_t r;

	policy("0:pq1;1-:k=pq2,v=kivi2", 3, &p);
	data = random_data(kvq_codebook_bytes(&p, 2, 32));
	want = write_file(&p, 2, 32, KVQ_CB_ROTATE, data, &want_len, &rc);
	cap = want_len + 1;
	got = malloc(cap);
	if (!want || !got || pipe(fds) != 0)
		abort();
	pid = fork();
	if (pid < 0)
		abort();
	if (pid == 0) {
		struct sigaction sa;
		struct itimerval it = { { 0, 100 }, { 0, 100 } };

		free(want);   /* the parent's, as a leak checker following the child would say */
		free(got);
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_alarm;   /* no SA_RESTART: write(2) returns short or EINTR */
		sigaction(SIGALRM, &sa, NULL);
		close(fds[0]);
		setitimer(ITIMER_REAL, &it, NULL);
		rc = kvq_codebook_write(fds[1], &p, 2, 32, KVQ_CB_ROTATE, data, kvq_codebook_bytes(&p, 2, 32));
		free(data);
		_exit(rc == 0 ? 0 : 1);
	}
	close(fds[1]);
	while ((r = read(fds[0], got + len, cap - len < 1000 ? cap - len : 1000)) > 0) {
		len += (size_t)r;
		if (++reads % 16 == 0)
			usleep(200);
	}
	close(fds[0]);
	waitpid(pid, &status, 0);
	ok(WIFEXITED(status) && WEXITSTATUS(status) == 0 && len == want_len && memcmp(got, want, len) == 0,
	   "written through a slow pipe under a 100 us timer: the same %zu bytes", len);
	free(got);
	free(want);
	free(data);
}

static void test_write_refused(void)
{
	struct kvq_policy p, q;
	uint16_t *data;
	uint64_t bytes;
	int fd = memfd_create("kvq-test-codebook", MFD_CLOEXEC);
	struct stat st;

	policy("k=int8,v=pq2", 2, &p);
	bytes = kvq_codebook_bytes(&p, 2, 32);
	data = random_data(bytes);
	policy("kivi2", 2, &q);
	ok(kvq_codebook_write(fd, &q, 2, 32, 0, data, 0) == -EINVAL, "write: a policy without codebooks: -EINVAL");
	ok(kvq_codebook_write(fd, &p, 2, 32, 0, data, bytes - 2) == -EINVAL &&
	   kvq_codebook_write(fd, &p, 2, 32, 0, data, bytes + 2) == -EINVAL, "write: data_bytes not the policy's: -EINVAL");
	ok(kvq_codebook_write(fd, &p, 2, 48, 0, data, kvq_codebook_bytes(&p, 2, 48)) == -EINVAL &&
	   kvq_codebook_write(fd, &p, 0, 32, 0, data, 0) == -EINVAL &&
	   kvq_codebook_write(fd, &p, 2, 32, 4, data, bytes) == -EINVAL, "write: head dim 48, 0 heads, "
	   "unknown transforms: -EINVAL");
	ok(fstat(fd, &st) == 0 && st.st_size == 0, "write: nothing written when refused");
	ok(kvq_codebook_write(-1, &p, 2, 32, 0, data, bytes) == -EBADF, "write: a bad descriptor: -EBADF");
	close(fd);
	free(data);
}

/* ------------------------------------------------------------- refusals */

/* A copy of img with room for one more byte. */
static uint8_t *copy(const uint8_t *img, size_t len)
{
	uint8_t *c = malloc(len + 1);

	if (!c)
		abort();
	memcpy(c, img, len);
	c[len] = 0;
	return c;
}

static void test_refusals(void)
{
	struct kvq_policy p, other;
	uint16_t *data;
	uint8_t *img, *c;
	size_t len = 0, off;
	uint64_t bytes;
	int rc, bad = 0;
	char err[512];
	const uint32_t H = 2, D = 32;

	/* layer 0 pq1 (d 8, M 4), layers 1-2 K pq2 (d 4, M 8), V kivi2 */
	policy("0:pq1;1-:k=pq2,v=kivi2", 3, &p);
	bytes = kvq_codebook_bytes(&p, H, D);
	data = random_data(bytes);
	img = write_file(&p, H, D, KVQ_CB_ROTATE | KVQ_CB_K_CENTER, data, &len, &rc);
	if (!img)
		abort();
	off = len - bytes;   /* the data */

	/* every proper prefix */
	for (size_t n = 0; n < len; n++) {
		struct kvq_cb_file f;

		err[0] = '\0';
		rc = kvq_codebook_parse(img, n, &p, H, D, &f, err, sizeof err);
		if (rc != -EINVAL || !strstr(err, "truncated")) {
			if (bad++ < 3)
				diag("%zu bytes: %d %s", n, rc, err);
		}
	}
	ok(bad == 0, "each of the %zu truncations is refused as truncated", len);
	REFUSED(img, len - 1, &p, H, D, "one byte short", "truncated", "the header says");

	c = copy(img, len);
	REFUSED(c, len + 1, &p, H, D, "one byte too many", "bytes after the data", "the header says");
	c[0] = 'k';
	REFUSED(c, len, &p, H, D, "bad magic", "magic");
	memcpy(c, img, len);
	wr32(c + 8, 2);
	REFUSED(c, len, &p, H, D, "version 2", "version 2, not 1");
	memcpy(c, img, len);
	/* as a writer of the other byte order would have put it */
	for (int o = 8; o < 40; o += 4)
		swap_bytes(c + o, 4);
	swap_bytes(c + 40, 8);
	REFUSED(c, len, &p, H, D, "the other byte order", "byte order");
	memcpy(c, img, len);
	wr32(c + 12, 0x01020305);
	REFUSED(c, len, &p, H, D, "a bad byte order mark", "byte order mark");

	/* header fields out of range */
	memcpy(c, img, len);
	wr32(c + 16, 0);
	REFUSED(c, len, NULL, 0, 0, "0 layers", "layers 0");
	wr32(c + 16, 257);
	REFUSED(c, len, NULL, 0, 0, "257 layers", "layers 257");
	memcpy(c, img, len);
	wr32(c + 20, 0);
	REFUSED(c, len, NULL, 0, 0, "0 kv heads", "kv heads 0");
	wr32(c + 20, 257);
	REFUSED(c, len, NULL, 0, 0, "257 kv heads", "kv heads 257");
	memcpy(c, img, len);
	wr32(c + 24, 48);
	REFUSED(c, len, NULL, 0, 0, "head dim 48", "head dim 48");
	wr32(c + 24, 288);
	REFUSED(c, len, NULL, 0, 0, "head dim 288", "head dim 288");
	memcpy(c, img, len);
	wr32(c + 28, 255);
	REFUSED(c, len, NULL, 0, 0, "255 centroids", "255 centroids");
	memcpy(c, img, len);
	wr32(c + 32, 4);
	REFUSED(c, len, NULL, 0, 0, "unknown transforms", "transforms 0x4");
	memcpy(c, img, len);
	wr32(c + 36, UINT32_MAX);
	REFUSED(c, len, NULL, 0, 0, "policy length 2^32-1", "policy length 4294967295");
	wr32(c + 36, KVQ_POLICY_MAX_LEN + 1);
	REFUSED(c, len, NULL, 0, 0, "policy length KVQ_POLICY_MAX_LEN + 1", "policy length 12289");

	/* sizes that lie */
	memcpy(c, img, len);
	wr64(c + 40, bytes + 2);
	REFUSED(c, len, NULL, 0, 0, "data_bytes 2 more", "data_bytes 131074", "imply 131072");
	wr64(c + 40, bytes - 32768);
	REFUSED(c, len, NULL, 0, 0, "data_bytes one (layer, K or V) less", "data_bytes 98304");
	wr64(c + 40, UINT64_MAX);
	REFUSED(c, len, NULL, 0, 0, "data_bytes 2^64-1", "data_bytes 18446744073709551615");
	/* the header of the largest geometry: 512 x 32 MiB of codebooks */
	{
		uint8_t big[48 + 512];

		memcpy(big, img, 48);
		wr32(big + 16, 256);
		wr32(big + 20, 256);
		wr32(big + 24, 256);
		wr32(big + 36, 0);
		wr64(big + 40, 512ull << 25);
		memset(big + 48, 4, 512);
		REFUSED(big, sizeof big, NULL, 0, 0, "16 GiB of codebooks", "exceed the limit of 1073741824");
	}

	/* subspace dims */
	memcpy(c, img, len);
	c[48 + 1] = 3;
	REFUSED(c, len, NULL, 0, 0, "subspace dim 3", "layer 1 K: subspace dim 3");
	memcpy(c, img, len);
	c[48 + 3] = 16;
	REFUSED(c, len, NULL, 0, 0, "subspace dim 16", "layer 0 V: subspace dim 16");
	memcpy(c, img, len);
	memset(c + 48, 0, 6);
	REFUSED(c, len, NULL, 0, 0, "no codebooks at all", "no layer has codebooks");
	memcpy(c, img, len);
	c[48 + 4] = 8;   /* layer 1 V: one (layer, V) more than the data holds */
	REFUSED(c, len, NULL, 0, 0, "a subspace dim the data lacks", "data_bytes 131072", "imply 163840");

	/* policy and padding */
	memcpy(c, img, len);
	c[48 + 6 + 2] = '\n';
	REFUSED(c, len, NULL, 0, 0, "a newline in the policy", "policy byte 2 is 0x0a");
	c[48 + 6 + 2] = 0;
	REFUSED(c, len, NULL, 0, 0, "a NUL in the policy", "policy byte 2 is 0x00");
	memcpy(c, img, len);
	c[off - 1] = 1;
	if (c[off - 1] == img[off - 1] || off % 16 != 0)
		abort();
	REFUSED(c, len, NULL, 0, 0, "padding not zero", "padding byte at offset");

	/* against the pool */
	policy("0:pq1;1-:k=pq2,v=kivi2", 4, &other);
	REFUSED(img, len, &other, H, D, "4 layers in the pool", "3 layers, the pool has 4");
	REFUSED(img, len, &p, 4, D, "4 kv heads in the pool", "2 kv heads, the pool has 4");
	REFUSED(img, len, &p, H, 64, "head dim 64 in the pool", "head dim 32, the pool's is 64");
	policy("0:pq2;1-:k=pq2,v=kivi2", 3, &other);
	REFUSED(img, len, &other, H, D, "pool pq2 where the file has pq1's", "layer 0", "the pool's K is pq2",
		"subspace dim 4", "subspace dim 8");
	policy("0:pq1;1-:pq2", 3, &other);
	REFUSED(img, len, &other, H, D, "pool pq2 V where the file has none", "layer 1", "the pool's V is pq2",
		"no V codebooks");
	policy("0:pq1;1:k=int8,v=kivi2;2:k=pq2,v=kivi2", 3, &other);
	REFUSED(img, len, &other, H, D, "pool int8 K where the file has codebooks", "layer 1", "the pool's K is int8",
		"not a codebook format");
	policy("0:k=pq1,v=int8;1-:k=pq2,v=kivi2", 3, &other);
	REFUSED(img, len, &other, H, D, "pool int8 V where the file has codebooks", "layer 0", "the pool's V is int8");
	/* the basis: the file's policy rotates nothing */
	policy("0:pq1;1-:k=pq2+rot,v=kivi2", 3, &other);
	REFUSED(img, len, &other, H, D, "pool rotating a K the file calibrated unrotated", "layer 1",
		"the pool's K is rotated (+rot)", "calibrated unrotated");
	policy("0:pq1;1-:k=pq2,v=kivi2+rot", 3, &other);
	rc = kvq_codebook_parse(img, len, &other, H, D, &(struct kvq_cb_file){ 0 }, err, sizeof err);
	ok(rc == 0, "a rotated part without codebooks (V kivi2+rot) does not matter to the file (%s)",
	   rc ? err : "accepted");
	{
		/* a file calibrated rotated: its pool takes it, the plain one not */
		struct kvq_policy rp;
		size_t rlen = 0;
		int wrc;
		policy("0:pq1;1-:k=pq2+rot,v=kivi2", 3, &rp);
		uint8_t *rimg = write_file(&rp, H, D, 0, data, &rlen, &wrc);
		if (!rimg)
			abort();
		rc = kvq_codebook_parse(rimg, rlen, &rp, H, D, &(struct kvq_cb_file){ 0 }, err, sizeof err);
		ok(rc == 0, "a file calibrated with K rotated fits the pool that rotates it (%s)", rc ? err : "accepted");
		REFUSED(rimg, rlen, &p, H, D, "a file calibrated rotated, a pool that does not rotate", "layer 1",
			"the pool's K is not rotated (+rot)", "calibrated rotated");
		free(rimg);
	}

	/* values: (layer 1, K, head 1, subspace 3, centroid 17, j 2): base 2
	 * parts, M = 32 / 4 = 8, word ((1 * 8 + 3) * 256 + 17) * 4 + 2 */
	memcpy(c, img, len);
	{
		size_t w = off + 2 * 32768 + 2 * (((1 * 8 + 3) * 256 + 17) * 4 + 2);

		c[w] = 0x00;
		c[w + 1] = 0x7e;   /* 0x7e00: NaN */
		REFUSED(c, len, &p, H, D, "a NaN", "layer 1 K head 1 subspace 3 centroid 17: not a number");
		c[w + 1] = 0x7c;   /* 0x7c01: a NaN of one mantissa bit */
		c[w] = 0x01;
		REFUSED(c, len, &p, H, D, "a NaN of the lowest mantissa bit", "centroid 17: not a number");
	}
	memcpy(c, img, len);
	/* (layer 0, V, head 1, subspace 3, centroid 255, j 7): base 1 part,
	 * M = 32 / 8 = 4, word ((1 * 4 + 3) * 256 + 255) * 8 + 7 */
	{
		size_t w = off + 32768 + 2 * (((1 * 4 + 3) * 256 + 255) * 8 + 7);

		c[w] = 0x00;
		c[w + 1] = 0x7c;   /* +inf */
		REFUSED(c, len, &p, H, D, "+inf", "layer 0 V head 1 subspace 3 centroid 255: infinite");
		c[w + 1] = 0xfc;   /* -inf */
		REFUSED(c, len, &p, H, D, "-inf", "layer 0 V head 1 subspace 3 centroid 255: infinite");
		c[w + 1] = 0x7b;
		c[w] = 0xff;       /* 65504, the largest finite */
		rc = kvq_codebook_parse(c, len, &p, H, D, &(struct kvq_cb_file){ 0 }, err, sizeof err);
		ok(rc == 0, "65504 is finite (%s)", rc ? err : "accepted");
	}
	/* of two bad values the first is named */
	{
		size_t w = off + 2 * 5;   /* layer 0 K head 0 subspace 0 centroid 0 */
		size_t w2 = off + 32768 + 2 * (((1 * 4 + 3) * 256 + 255) * 8 + 7);

		c[w2] = 0x00;
		c[w2 + 1] = 0x7e;
		c[w] = 0;
		c[w + 1] = 0xfc;
		REFUSED(c, len, &p, H, D, "two bad values", "layer 0 K head 0 subspace 0 centroid 0: infinite");
	}
	REFUSED(NULL, 100, NULL, 0, 0, "no image", "no image");
	free(c);
	free(img);
	free(data);
}

int main(void)
{
	tap_seed();
	test_sizes();
	round_trip("0:pq1;1-:k=pq2,v=kivi2", 3, 2, 32, KVQ_CB_ROTATE | KVQ_CB_K_CENTER);
	round_trip("k=int8,v=pq2", 2, 4, 64, 0);
	round_trip("0:pq2;1:k=pq1,v=f16;2-4:k=kivi4,v=pq1;5:int4g32", 6, 1, 128, KVQ_CB_ROTATE);
	test_pipe();
	test_write_refused();
	test_refusals();
	return done_testing();
}
