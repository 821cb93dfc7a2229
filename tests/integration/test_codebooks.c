/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration test: a pool's codebooks travel from the client that creates
 * it to the real kvqd (kvq.proto, "File descriptors", version 4) and become
 * part of the pool's identity.  libkvq (kvq_attach_params.codebooks), the
 * raw protocol (proto/conn.h) for what libkvq never sends, and kvqctl
 * (pool create --codebooks):
 *   - created with good codebooks: the pool's codebook region holds their
 *     data, Stats and kvqctl show its SHA-256 (computed here with libcrypto);
 *   - joining with other codebooks: KVQ_ELAYOUT, the pool unchanged; with
 *     none or the same: joined;
 *   - refused with a reason, nothing created: no codebooks for a codebook
 *     policy, a truncated file, another head dim, a NaN, descriptors that are
 *     not sealed memfds (unsealed, partly sealed, a pipe, a regular file),
 *     codebooks announced without a descriptor and the reverse, codebooks for
 *     a policy without codebook formats;
 *   - hostile: several descriptors with one frame, descriptors with other
 *     requests, more than a read takes: closed, kvqd goes on;
 *   - kvqd holds no descriptor more afterwards (/proc/PID/fd).
 *
 * KVQ_TEST_KVQD names the kvqd binary, KVQ_TEST_KVQCTL the kvqctl binary.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "../tap.h"
#include "../daemon.h"
#include "codebook.h"
#include "conn.h"
#include "figure.h"
#include "frame_io.h"
#include "kvq.h"
#include "layout.h"
#include "memfd.h"

#define L_ 2
#define H_ 2
#define D_ 64
#define B_ 16
#define POLICY "k=int8,v=pq2"
#define MODEL "test/codebooks@1"
#define TIMEOUT_MS 5000

static char sock_path[108], tmpdir[64], daemon_bin[512], ctl_bin[512];
static pid_t kvqd;

/* ---------------------------------------------------------------- files */

/* A codebook file; data as the pool's codebook region must hold it. */
struct cbfile {
	char path[128];
	uint8_t *data;                  /* little-endian FP16 */
	uint64_t data_bytes;
	uint8_t sha[32];
};

static uint64_t rng = 1;

static double rnd_normal(void)
{
	double u1, u2;

	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	u1 = ((rng >> 11) + 1.0) / 9007199254740993.0;
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	u2 = (rng >> 11) / 9007199254740992.0;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Writes name in tmpdir: codebooks of policy at head_dim, values from seed
 * (value nan_at a NaN, unless ~0), cut_tail bytes short.  0 or -1. */
static int cb_make(struct cbfile *f, const char *name, const char *policy, uint32_t head_dim, uint64_t seed,
		   uint64_t nan_at, size_t cut_tail)
{
	struct kvq_policy pol;
	uint16_t *v;
	uint64_t n;
	unsigned hlen = 0;
	int fd, r;
	struct stat st;

	memset(f, 0, sizeof(*f));
	snprintf(f->path, sizeof(f->path), "%s/%s", tmpdir, name);
	if (kvq_policy_parse(policy, L_, &pol, NULL, 0) < 0)
		return -1;
	n = kvq_codebook_bytes(&pol, H_, head_dim);
	v = malloc(n);
	f->data = malloc(n);
	if (!v || !f->data)
		return -1;
	rng = seed;
	for (uint64_t i = 0; i < n / 2; i++) {
		v[i] = i == nan_at ? 0x7e00 : kvq_f16_from_f32((float)rnd_normal());
		f->data[2 * i] = (uint8_t)v[i];
		f->data[2 * i + 1] = (uint8_t)(v[i] >> 8);
	}
	f->data_bytes = n;
	EVP_Digest(f->data, n, f->sha, &hlen, EVP_sha256(), NULL);
	fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	r = fd >= 0 ? kvq_codebook_write(fd, &pol, H_, head_dim, KVQ_CB_ROTATE, v, n) : -1;
	if (r == 0 && cut_tail && (fstat(fd, &st) < 0 || ftruncate(fd, st.st_size - (off_t)cut_tail) < 0))
		r = -1;
	if (fd >= 0)
		close(fd);
	free(v);
	return r == 0 && hlen == 32 ? 0 : -1;
}

/* The file at path in a memfd sealed as libkvq seals it, or -1. */
static int sealed(const char *path)
{
	int fd = -1;

	return kvq_memfd_from_file(path, KVQ_CB_MAX_FILE, "cbtest", &fd, NULL, 0) == 0 ? fd : -1;
}

/* The file at path in a new memfd with seals (0: none).  The fd, or -1. */
static int memfd_sealed(const char *path, unsigned seals)
{
	char buf[65536];
	int in = open(path, O_RDONLY | O_CLOEXEC), fd = memfd_create("cbtest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ssize_t k;

	if (in < 0 || fd < 0)
		goto fail;
	while ((k = read(in, buf, sizeof(buf))) > 0)
		if (write(fd, buf, (size_t)k) != k)
			goto fail;
	if (k < 0 || (seals && fcntl(fd, F_ADD_SEALS, seals) < 0))
		goto fail;
	close(in);
	return fd;
fail:
	if (in >= 0)
		close(in);
	if (fd >= 0)
		close(fd);
	return -1;
}

static void hex(const uint8_t *h, size_t n, char *buf)
{
	for (size_t i = 0; i < n; i++)
		sprintf(buf + 2 * i, "%02x", h[i]);
}

/* ---------------------------------------------------------------- kvqd */

/* Descriptors kvqd has open. */
static int daemon_fds(void)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)kvqd);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* kvqd's descriptors once they are want, or after 3 s what they are: it
 * closes a connection when it reads the end of the stream. */
static int daemon_fds_settle(int want)
{
	int n = daemon_fds();

	for (int i = 0; i < 300 && n != want; i++) {
		usleep(10000);
		n = daemon_fds();
	}
	return n;
}

/* kvqd's descriptors once the count has not changed for 200 ms. */
static int daemon_fds_stable(void)
{
	int n = daemon_fds(), same = 0;

	for (int i = 0; i < 300 && same < 20; i++) {
		int m;

		usleep(10000);
		m = daemon_fds();
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}

/* Waits until pool has no client attached (kvqd reads the end of their
 * streams in its own time).  0, or -1 after 3 s. */
static int pool_idle(const char *pool);

static int raw_open(struct kvq_conn *c)
{
	kvq_conn_init(c, TIMEOUT_MS);
	return kvq_conn_open(c, sock_path, "cbtest");
}

/* The test geometry's Attach of pool with policy into a, pc (create: with
 * 16 sealed + 4 open slots), announcing codebooks when announce. */
static void attach_make(Kvq__Attach *a, Kvq__PoolCreate *pc, const char *pool, const char *policy, bool create,
			bool announce)
{
	kvq__attach__init(a);
	kvq__pool_create__init(pc);
	a->pool = (char *)pool;
	a->model_id = MODEL;
	a->layers = L_;
	a->kv_heads = H_;
	a->head_dim = D_;
	a->block_tokens = B_;
	a->policy = (char *)policy;
	a->act = KVQ__DTYPE__DTYPE_F16;
	a->layout_version = KVQ_LAYOUT_VERSION;
	pc->n_sealed = 16;
	pc->n_open = 4;
	pc->backend = "host";
	pc->device = -1;
	a->create = create ? pc : NULL;
	a->codebooks = announce;
}

/* An Attach on c with fd (-1: none): the reply's status, kvqd's reason in
 * c->msg; the AttachReply's codebooks_sha256 into sha (when not NULL). */
static int raw_attach(struct kvq_conn *c, const char *pool, const char *policy, bool create, bool announce, int fd,
		      uint8_t *sha)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a;
	Kvq__PoolCreate pc;
	int r;

	attach_make(&a, &pc, pool, policy, create, announce);
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = kvq_conn_call_fd(c, &e, fd, KVQ__ENVELOPE__BODY_ATTACH_REPLY, &rep);
	if (r == 0 && sha)
		memcpy(sha, rep->attach_reply->codebooks_sha256.data, rep->attach_reply->codebooks_sha256.len == 32 ? 32 : 0);
	if (r == 0 && c->pool_fd >= 0) {
		close(c->pool_fd);
		c->pool_fd = -1;
	}
	kvq_frame_envelope_free(rep);
	return r;
}

/* A new connection's Attach that creates pool with policy, and fd: the
 * status, kvqd's reason in msg. */
static int try_create(const char *pool, const char *policy, bool announce, int fd, char *msg, size_t len)
{
	struct kvq_conn c;
	int r = raw_open(&c);

	if (r == 0)
		r = raw_attach(&c, pool, policy, true, announce, fd, NULL);
	snprintf(msg, len, "%s", c.msg);
	kvq_conn_close(&c);
	return r;
}

/* Stats of pool: 0 with its figures, or -ENOENT when kvqd has none. */
struct pst {
	uint8_t sha[32];
	size_t sha_len;
	uint32_t clients, n_sealed;
	uint64_t total_bytes;
};

static int pool_stats(const char *pool, struct pst *ret)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	struct kvq_conn c;
	int r = raw_open(&c);

	memset(ret, 0, sizeof(*ret));
	s.pool = (char *)pool;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	if (r == 0)
		r = kvq_conn_call(&c, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, &rep);
	if (r == 0 && rep->stats_reply->n_pools == 1) {
		const Kvq__PoolStats *p = rep->stats_reply->pools[0];

		ret->sha_len = p->codebooks_sha256.len;
		if (ret->sha_len == 32)
			memcpy(ret->sha, p->codebooks_sha256.data, 32);
		/* the pool's figures by name (kvq.proto PoolStats.figures) */
		ret->clients = (uint32_t)kvq_figure_or_0(p, "clients");
		ret->n_sealed = (uint32_t)kvq_figure_or_0(p, "n_sealed");
		ret->total_bytes = kvq_figure_or_0(p, "total_bytes");
	} else if (r == 0) {
		r = -EBADMSG;
	}
	kvq_frame_envelope_free(rep);
	kvq_conn_close(&c);
	return r;
}

static int pool_idle(const char *pool)
{
	struct pst st;

	for (int i = 0; i < 300; i++) {
		if (pool_stats(pool, &st) == 0 && st.clients == 0)
			return 0;
		usleep(10000);
	}
	return -1;
}

/* Sends one frame of e on c with nfds copies of fd: its reply's status
 * (kvq_conn_reply), or a transport error. */
static int send_with_fds(struct kvq_conn *c, Kvq__Envelope *e, Kvq__Envelope__BodyCase want, int fd, int nfds)
{
	union {
		char buf[CMSG_SPACE(32 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	Kvq__Envelope *rep = NULL;
	int fds[32], r;
	uint8_t *buf;
	size_t len;

	e->id = ++c->next_id;
	if (nfds > 32 || kvq_frame_encode_alloc(e, &buf, &len) < 0)
		return -EINVAL;
	for (int i = 0; i < nfds; i++)
		fds[i] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	iov.iov_base = buf;
	iov.iov_len = len;
	memset(&u, 0, sizeof(u));
	msg.msg_control = u.buf;
	msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	r = sendmsg(c->fd, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -EIO;
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	free(buf);
	if (r == 0)
		r = kvq_conn_reply(c, e->id, want, &rep);
	if (r == 0 && c->pool_fd >= 0) {
		close(c->pool_fd);
		c->pool_fd = -1;
	}
	kvq_frame_envelope_free(rep);
	return r;
}

/* ---------------------------------------------------------------- kvqctl */

static char ctl_out[65536], ctl_err[4096];

static void read_all(int fd, char *buf, size_t len)
{
	size_t n = 0;
	ssize_t k;

	while (n + 1 < len && (k = read(fd, buf + n, len - 1 - n)) > 0)
		n += (size_t)k;
	buf[n] = 0;
}

/* Runs kvqctl --socket ... with args (NULL-terminated): its exit code,
 * ctl_out and ctl_err. */
static int kvqctl(const char *const *args)
{
	const char *argv[40];
	int po[2], pe[2], st = 0, n = 0;
	pid_t pid;

	argv[n++] = ctl_bin;
	argv[n++] = "--socket";
	argv[n++] = sock_path;
	for (; *args && n < 39; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	if (pipe(po) < 0 || pipe(pe) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	read_all(po[0], ctl_out, sizeof(ctl_out));   /* kvqctl writes little: no deadlock on stderr */
	read_all(pe[0], ctl_err, sizeof(ctl_err));
	close(po[0]);
	close(pe[0]);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#define KVQCTL(...) kvqctl((const char *const[]){ __VA_ARGS__, NULL })

/* ---------------------------------------------------------------- tests */

static struct cbfile good, other, trunc_, shape, nan_;
static struct cbfile *const files[] = { &good, &other, &trunc_, &shape, &nan_ };

/* libkvq's attach of the test geometry to pool, with codebooks (NULL:
 * none): its status, the client in *ret (kvq_client_free) when 0. */
static int lib_attach(const char *pool, const char *codebooks, kvq_client **ret, char *msg, size_t len)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_, .head_dim = D_,
		.block_tokens = B_, .policy = POLICY, .act = KVQ_ACT_F16, .create = 1, .n_sealed = 16, .n_open = 4,
		.backend = "host", .device = -1, .codebooks = codebooks };
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock_path, "cbtest", &c);

	if (r == 0)
		r = kvq_client_attach(c, &p);
	snprintf(msg, len, "%s", c ? kvq_client_error(c) : "");
	if (r == 0)
		*ret = c;
	else
		kvq_client_free(c);
	return r;
}

/* Whether client c's pool holds f's data in its codebook region. */
static bool region_holds(kvq_client *c, const struct cbfile *f)
{
	const struct kvq_layout *L = kvq_client_layout(c);
	const uint8_t *base = kvq_client_base(c);

	return L && base && L->codebook_bytes == f->data_bytes &&
	       !memcmp(base + L->codebook_off, f->data, (size_t)f->data_bytes);
}

static void test_libkvq(kvq_client *cl[3], int *fds_live)
{
	char msg[KVQ_PROTO_MAX_MESSAGE + 1], h[65];
	struct pst st, st2;
	kvq_client *c = NULL;
	int r;

	r = lib_attach("cb", good.path, &cl[0], msg, sizeof(msg));
	ok(r == 0, "libkvq creates pool cb (%s) with codebooks: %d %s", POLICY, r, msg);
	ok(r == 0 && region_holds(cl[0], &good), "the pool's codebook region holds the file's data");
	r = pool_stats("cb", &st);
	hex(good.sha, 32, h);
	ok(r == 0 && st.sha_len == 32 && !memcmp(st.sha, good.sha, 32),
	   "Stats: codebooks_sha256 is the SHA-256 of the file's data (%s)", h);

	r = lib_attach("cb", NULL, &cl[1], msg, sizeof(msg));
	ok(r == 0 && region_holds(cl[1], &good), "joining without codebooks: joined, the pool's codebooks (%d %s)", r,
	   msg);
	r = lib_attach("cb", good.path, &cl[2], msg, sizeof(msg));
	ok(r == 0, "joining with the same codebooks: joined (%d %s)", r, msg);

	r = lib_attach("cb", other.path, &c, msg, sizeof(msg));
	ok(r == KVQ_ELAYOUT && strstr(msg, "codebooks differ from pool cb's"),
	   "joining with other codebooks: KVQ_ELAYOUT (%s)", msg);
	r = pool_stats("cb", &st2);
	ok(r == 0 && st2.clients == 3 && st2.sha_len == 32 && !memcmp(st2.sha, good.sha, 32) &&
	   st2.total_bytes == st.total_bytes && region_holds(cl[0], &good),
	   "the pool unchanged: %u clients, its codebooks and their bytes", st2.clients);
	r = lib_attach("cb", "/nonexistent/codebooks", &c, msg, sizeof(msg));
	ok(r == -ENOENT && strstr(msg, "/nonexistent/codebooks"), "a codebook file that is not there: -ENOENT (%s)",
	   msg);
	*fds_live = daemon_fds_stable();
}

/* A refused create: its status and reason, and no pool of that name. */
static void refused(const char *pool, const char *policy, bool announce, int fd, int want, const char *reason,
		    const char *what)
{
	char msg[KVQ_PROTO_MAX_MESSAGE + 1];
	struct pst st;
	int r = try_create(pool, policy, announce, fd, msg, sizeof(msg));

	ok(r == want && strstr(msg, reason) && pool_stats(pool, &st) == -ENOENT, "%s: %d (%s), nothing created", what,
	   r, msg);
}

static void test_refused(int fds_live)
{
	struct pst st;
	int fd, p[2], n;

	fd = sealed(trunc_.path);
	refused("bad", POLICY, false, -1, -EINVAL, "must come with the request", "a codebook policy without codebooks");
	refused("bad", POLICY, true, fd, -EINVAL, "truncated", "a truncated file");
	close(fd);
	fd = sealed(shape.path);
	refused("bad", POLICY, true, fd, -EINVAL, "head dim 32, the pool's is 64", "codebooks of another head dim");
	close(fd);
	fd = sealed(nan_.path);
	refused("bad", POLICY, true, fd, -EINVAL, "codebook file: layer", "a NaN among the values");
	close(fd);

	fd = memfd_sealed(good.path, 0);
	refused("bad", POLICY, true, fd, -EINVAL, "not sealed", "a memfd without seals");
	close(fd);
	fd = memfd_sealed(good.path, F_SEAL_SHRINK | F_SEAL_GROW);
	refused("bad", POLICY, true, fd, -EINVAL, "not sealed against writing", "a memfd not sealed against writing");
	close(fd);
	fd = memfd_sealed(good.path, F_SEAL_WRITE);
	refused("bad", POLICY, true, fd, -EINVAL, "not sealed", "a memfd sealed against writing only");
	close(fd);
	if (pipe(p) < 0)
		p[0] = p[1] = -1;
	refused("bad", POLICY, true, p[0], -EINVAL, "not a regular file", "a pipe");
	close(p[0]);
	close(p[1]);
	fd = open(good.path, O_RDONLY | O_CLOEXEC);
	refused("bad", POLICY, true, fd, -EINVAL, "memfd", "the codebook file itself, not a memfd");
	close(fd);

	fd = sealed(good.path);
	refused("bad", POLICY, true, -1, -EINVAL, "announced but no descriptor came", "codebooks announced, none sent");
	refused("bad", POLICY, false, fd, -EINVAL, "announces no codebooks", "a descriptor, no codebooks announced");
	refused("bad", "int8", true, fd, -EINVAL, "has no codebook format", "codebooks for a policy without codebooks");

	/* joining the pool with bad codebooks: refused, the pool as it was */
	{
		struct kvq_conn c;
		int bad = memfd_sealed(good.path, 0), r = raw_open(&c);

		r = r == 0 ? raw_attach(&c, "cb", POLICY, false, true, bad, NULL) : r;
		ok(r == -EINVAL && strstr(c.msg, "not sealed") && pool_stats("cb", &st) == 0 && st.clients == 3,
		   "joining with an unsealed memfd: -EINVAL (%s), the pool unchanged", c.msg);
		kvq_conn_close(&c);
		close(bad);
		r = raw_open(&c);
		r = r == 0 ? raw_attach(&c, "cb", POLICY, false, true, fd, st.sha) : r;
		ok(r == 0 && !memcmp(st.sha, good.sha, 32), "joining with the same codebooks, raw: its sha256 in the reply");
		kvq_conn_close(&c);
	}
	close(fd);
	n = daemon_fds_settle(fds_live);
	ok(n == fds_live, "kvqd holds no descriptor more after the refusals (%d, %d before)", n, fds_live);
}

static void test_hostile(int fds_live)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Stats s = KVQ__STATS__INIT;
	Kvq__Attach a;
	Kvq__PoolCreate pc;
	struct kvq_conn c, c2;
	struct pst st;
	int fd = -1, r, n;

	fd = sealed(good.path);
	r = raw_open(&c);
	attach_make(&a, &pc, "multi", POLICY, true, true);
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = r == 0 ? send_with_fds(&c, &e, KVQ__ENVELOPE__BODY_ATTACH_REPLY, fd, 3) : r;
	ok(r == 0 && pool_stats("multi", &st) == 0 && st.sha_len == 32 && !memcmp(st.sha, good.sha, 32),
	   "three descriptors with one Attach: the first taken, pool created (%d %s)", r, c.msg);

	kvq__envelope__init(&e);
	s.pool = "";
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = send_with_fds(&c, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, fd, 2);
	ok(r == 0, "two descriptors with a Stats: answered, not an error (%d)", r);
	r = send_with_fds(&c, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, fd, KVQ_FRAME_RECV_FDS + 4);
	ok(r < 0 && c.fault == KVQ_CONN_TRANSPORT, "%u descriptors in one message: kvqd closes the connection (%d)",
	   KVQ_FRAME_RECV_FDS + 4, r);
	kvq_conn_close(&c);
	r = raw_open(&c2);
	r = r == 0 ? kvq_conn_call(&c2, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, NULL) : r;
	ok(r == 0, "kvqd answers the next connection (%d)", r);
	kvq_conn_close(&c2);
	close(fd);
	/* one descriptor more: multi's memory */
	n = daemon_fds_settle(fds_live + 1);
	ok(n == fds_live + 1, "kvqd holds only the new pool's descriptor more (%d, %d before)", n, fds_live);
}

static void test_kvqctl(void)
{
	char h[65];
	int r;

	r = KVQCTL("pool", "create", "adm", "--model", MODEL, "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		   "--policy", POLICY, "--sealed", "16", "--open", "4", "--block-tokens", "16");
	ok(r == 1 && strstr(ctl_err, "must come with the request"),
	   "kvqctl pool create of a codebook policy without --codebooks: exit 1 (%s)", ctl_err);
	r = KVQCTL("pool", "create", "adm", "--model", MODEL, "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		   "--policy", POLICY, "--sealed", "16", "--open", "4", "--block-tokens", "16", "--codebooks", good.path);
	hex(good.sha, 8, h);
	ok(r == 0 && strstr(ctl_out, h), "kvqctl pool create --codebooks: created, its sha256 shown (%s)", ctl_out);
	r = KVQCTL("pool", "create", "adm2", "--model", MODEL, "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		   "--policy", POLICY, "--sealed", "16", "--open", "4", "--codebooks", nan_.path);
	ok(r == 1 && strstr(ctl_err, "codebook file"), "kvqctl pool create with a bad file: exit 1 (%s)", ctl_err);
	r = KVQCTL("pool", "create", "adm2", "--model", MODEL, "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		   "--policy", POLICY, "--codebooks", "/nonexistent/cb");
	ok(r == 1 && strstr(ctl_err, "/nonexistent/cb"), "kvqctl pool create with a missing file: exit 1 (%s)", ctl_err);
	hex(good.sha, 4, h);
	r = KVQCTL("pools");
	ok(r == 0 && strstr(ctl_out, "CODEBOOKS") && strstr(ctl_out, h), "kvqctl pools: the short sha256 (%s)", h);
	r = KVQCTL("stats", "adm");
	hex(good.sha, 8, h);
	ok(r == 0 && strstr(ctl_out, "codebooks") && strstr(ctl_out, h), "kvqctl stats: the pool's sha256");
	hex(good.sha, 32, h);
	r = KVQCTL("--json", "stats", "adm");
	ok(r == 0 && strstr(ctl_out, "\"codebooks_sha256\":\"") && strstr(ctl_out, h),
	   "kvqctl --json stats: codebooks_sha256 in full");
	r = KVQCTL("--json", "stats", "small");
	ok(r == 0 && strstr(ctl_out, "\"codebooks_sha256\":\"\""), "a pool without codebooks: codebooks_sha256 \"\"");
	r = KVQCTL("pool", "drop", "adm");
	ok(r == 0, "kvqctl pool drop of a pool with codebooks (%s)", ctl_err);
}

int main(void)
{
	const char *top = getenv("top_builddir"), *env_ctl = getenv("KVQ_TEST_KVQCTL");
	kvq_client *cl[3] = { NULL };
	struct kvq_conn c;
	int fds0, fds_live, n;

	tap_seed();
	kvqd = test_daemon_start("host", "codebooks", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				 sizeof(daemon_bin));
	if (kvqd < 0) {
		ok(0, "kvqd started");
		return done_testing();
	}
	snprintf(ctl_bin, sizeof(ctl_bin), "%s", env_ctl ? env_ctl : "");
	if (!env_ctl)
		snprintf(ctl_bin, sizeof(ctl_bin), "%s/kvqctl/kvqctl", top ? top : ".");
	n = cb_make(&good, "good.cb", POLICY, D_, 1, ~0ull, 0) == 0 &&
	    cb_make(&other, "other.cb", POLICY, D_, 2, ~0ull, 0) == 0 &&
	    cb_make(&trunc_, "trunc.cb", POLICY, D_, 1, ~0ull, 100) == 0 &&
	    cb_make(&shape, "shape.cb", POLICY, 32, 1, ~0ull, 0) == 0 &&
	    cb_make(&nan_, "nan.cb", POLICY, D_, 1, 4321, 0) == 0;
	ok(n, "codebook files written (kvq_codebook_write): %llu data bytes each", (unsigned long long)good.data_bytes);
	/* a pool without codebooks, for the baseline and kvqctl */
	raw_open(&c);
	n = raw_attach(&c, "small", "int8", true, false, -1, NULL);
	kvq_conn_close(&c);
	ok(n == 0, "a pool without codebook formats is created as before (%d)", n);
	fds0 = daemon_fds_stable();

	test_libkvq(cl, &fds_live);
	test_refused(fds_live);
	test_hostile(fds_live);
	test_kvqctl();

	for (int i = 0; i < 3; i++)
		kvq_client_free(cl[i]);
	ok(pool_idle("cb") == 0 && pool_idle("multi") == 0 && KVQCTL("pool", "drop", "cb") == 0 &&
	   KVQCTL("pool", "drop", "multi") == 0, "the pools dropped once their clients left (%s)", ctl_err);
	n = daemon_fds_settle(fds0);
	ok(n == fds0, "kvqd holds the descriptors it held before the codebook pools (%d, %d before)", n, fds0);
	ok(kill(kvqd, 0) == 0, "kvqd still runs");
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		unlink(files[i]->path);
		free(files[i]->data);
	}

	test_daemon_stop(kvqd, tmpdir);
	return done_testing();
}
