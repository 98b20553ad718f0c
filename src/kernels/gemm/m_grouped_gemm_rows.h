// The m-grouped GEMM with its output rows scattered to per-row addresses: internal, for the EP
// layer's fused combine (docs/notes/ep.md, "Fused combine"); not part of include/mxmoe/gemm.h.
#pragma once
#include <cstdint>

#include "mxmoe/gemm.h"

namespace mxmoe::detail {

// m_grouped_mxfp8_gemm_nt (gemm.h: same operands, offsets, modes and bits) except where the output
// goes: row r of Y [m_total, n] (BF16) is written to row_dst[r] (n contiguous BF16, 16-byte
// aligned; any address this GPU maps, a peer's NCCL window included) instead of y[r]; a null
// row_dst[r] is not written (pad rows). row_dst: device array of m_total pointers, 8-byte aligned,
// read by the kernel only (its contents are not checked on the host). Every destination row must
// be distinct (rows are written concurrently). The writes are complete and ordered at system scope
// when the kernel ends (the row epilogue waits for them, then fence.proxy.async + fence.sc.sys), so
// a later kernel in the stream may publish them to peers with a release (the EP barrier).
// Kernel: the mode's wide tile (fast 192, exact 256) whatever opts.fast_tile_n, MXMOE_GEMM_TILE or
// MXMOE_GEMM_TMA_STORE say (the row epilogue needs its staging); a row's values do not depend on
// the tile width (gemm.h), so the bits are those of the other paths. Requires opts.out_dtype BF16
// and !opts.accumulate (mxmoe::Error naming the argument otherwise, before any CUDA call).
void m_grouped_mxfp8_gemm_nt_to_rows(const MxOperand& a, int64_t m_total, const MxOperand& b, int num_experts,
                                     int64_t n, int64_t k, const int32_t* offsets, void* const* row_dst,
                                     const GemmOptions& opts);

}  // namespace mxmoe::detail
