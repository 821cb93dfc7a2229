/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sealed-chunk loop of decode_kernel (decode.cuh) alone, for
 * bench/decode-isa.sh to count its instructions: one warp loads, scores,
 * softmaxes and accumulates 32-token chunks back to back with the kernel's
 * own stage functions, as the kernel's steady state does.  Compiled only,
 * never run; ISA_K, ISA_V (format ids), ISA_D and ISA_ACT name the instance.
 */
#include "cuda/decode.cuh"

namespace kvq {

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(DEC_WARPS * 32, (dec_tune<KF, VF, D>::minb)) isa_chunks(attn_args a, uint32_t nch,
											   float *out)
{
	typedef dec_lay<KF, VF, D> LY;
	const kvq_seq_table s = a.seqs[blockIdx.z];
	const layer_dev &l = a.l;
	dec_qset<D, LY::KPARTS> q;
	dec_kch<D> kq;
	dec_state<D, LY::NGV> st;

	dec_q_setup<KF, VF, D, ACT>(a, s, blockIdx.y, out, q);
	kq.slot = DEC_NOSLOT;
	dec_state_init(st);
	/* chunk u of block u: blocks of one chunk (B = 32, kvq-bench's), so
	 * KIVI's channel parameters are folded into q every chunk, as there */
	for (uint32_t u = 0; u < nch; u++) {
		dec_raw<KF, VF, D, false, LY> r;
		const uint8_t *hs = a.base + (size_t)u * l.sealed_head;
		dec_load(r, hs + l.off[KVQ_K_CODES], hs + l.off[KVQ_V_CODES], hs + l.off[KVQ_K_PARAMS],
			 hs + l.off[KVQ_V_PARAMS], l.B, 0, u * DEC_CHUNK, s.n);
		dec_kch_update<KF, VF, D, ACT, LY>(kq, u, q.qf, hs + l.off[KVQ_K_PARAMS], dec_reg());
		dec_compute<KF, VF, D, ACT, false, LY>(st, r, u * DEC_CHUNK, q.qf, kq, q.qg, q.lim, q.sl2);
	}
	float acc = st.sm[0].l + st.sm[1].l;
#pragma unroll
	for (int mt = 0; mt < D / 16; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			acc += st.acc[mt][i] * st.unit[mt * 16 / LY::VGS];
	out[threadIdx.x] = acc;
}

template __global__ void isa_chunks<ISA_K, ISA_V, ISA_D, ISA_ACT>(attn_args, uint32_t, float *);

} /* namespace kvq */
