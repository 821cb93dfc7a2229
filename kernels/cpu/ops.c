/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu.h"
#include "ops.h"

#ifdef HAVE_X86_SIMD
#include <cpuid.h>
#endif

static const struct kvq_cpu_ops *current;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int have_avx2(void)
{
#ifdef HAVE_X86_SIMD
	unsigned a, b, c, d;

	__builtin_cpu_init();
	/* F16C from CPUID leaf 1: clang's __builtin_cpu_supports does not know it */
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
	       (c & bit_F16C);
#else
	return 0;
#endif
}

static const struct kvq_cpu_ops *pick(const char *name)
{
	if (!name || !strcmp(name, "auto") || !strcmp(name, "avx2")) {
#ifdef HAVE_X86_SIMD
		if (have_avx2())
			return &kvq_cpu_ops_avx2;
#endif
		return name && !strcmp(name, "avx2") ? NULL : &kvq_cpu_ops_portable;
	}
	if (!strcmp(name, "portable"))
		return &kvq_cpu_ops_portable;
	return NULL;
}

static void init_once(void)
{
	const char *env = getenv("KVQ_CPU_ISA");
	const struct kvq_cpu_ops *o = pick(env && *env ? env : "auto");

	current = o ? o : &kvq_cpu_ops_portable;
}

const struct kvq_cpu_ops *kvq_cpu_ops(void)
{
	pthread_once(&once, init_once);
	return current;
}

int kvq_cpu_set_isa(const char *name)
{
	const struct kvq_cpu_ops *o = pick(name);

	pthread_once(&once, init_once);
	if (!o)
		return -ENOTSUP;
	current = o;
	return 0;
}

const char *kvq_cpu_isa(void)
{
	return kvq_cpu_ops()->name;
}
