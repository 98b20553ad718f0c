"""Bad arguments raise RuntimeError / ValueError whose message names the argument, before any
launch. The device checks run without a GPU (CPU tensors reach the op's CPU registration, which
rejects them); the rest need the GPU."""
import pytest
import torch

from _util import mxmoe

BAD = (RuntimeError, ValueError)


@pytest.mark.ext
def test_cpu_tensors_are_rejected_naming_the_argument():
    x = torch.randn(64, 64).to(torch.bfloat16)
    with pytest.raises(BAD, match=r"argument 'x' must be a CUDA tensor"):
        mxmoe.quantize(x)
    with pytest.raises(BAD, match=r"argument 'ids' must be a CUDA tensor"):
        mxmoe.moe_plan(torch.zeros(4, 2, dtype=torch.int32), 4)
    with pytest.raises(BAD, match=r"argument 'offsets' must be a CUDA tensor"):
        mxmoe.compute_padded_offsets(torch.zeros(5, dtype=torch.int32))
    with pytest.raises(BAD, match=r"argument 'mode'"):
        mxmoe.quantize(x, mode="nearest")  # checked in Python before the op


@pytest.mark.gpu
class TestOnGpu:
    dev = "cuda"

    def x(self, *shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=self.dev).to(dtype)

    def test_quantize(self):
        with pytest.raises(BAD, match=r"argument 'x' must have dtype BFloat16"):
            mxmoe.quantize(self.x(64, 64, dtype=torch.float32))
        with pytest.raises(BAD, match=r"argument 'x'.*2-D .* or 3-D"):
            mxmoe.quantize(self.x(64))
        with pytest.raises(BAD, match=r"'x.shape\[-1\]' = 100"):
            mxmoe.quantize(self.x(64, 100))
        with pytest.raises(BAD, match=r"'x.shape\[-2\]' = 48"):
            mxmoe.quantize(self.x(48, 64), colwise=True)
        with pytest.raises(BAD, match=r"argument 'x' must be contiguous"):
            mxmoe.quantize(self.x(64, 128).t())
        base = self.x(64 * 64 + 1)
        with pytest.raises(BAD, match=r"argument 'x' must be 16-byte aligned"):
            mxmoe.quantize(base[1:].view(64, 64))
        with pytest.raises(BAD, match=r"'rowwise', 'colwise'"):
            mxmoe.quantize(self.x(64, 64), rowwise=False, colwise=False)
        with pytest.raises(BAD, match=r"argument 'mode' = 5"):
            torch.ops.mxmoe.quantize_mxfp8(self.x(64, 64), True, False, False, 5)
        with pytest.raises(BAD, match=r"argument 'x' must be a CUDA tensor"):
            mxmoe.quantize(self.x(64, 64).cpu())

    def test_grouped_and_gather(self):
        x = self.x(100, 64)
        off = torch.tensor([0, 50, 100], dtype=torch.int32, device=self.dev)
        with pytest.raises(BAD, match=r"argument 'offsets' must have dtype Int"):
            mxmoe.quantize_grouped(x, off.long(), 256, padded_offsets=off)
        with pytest.raises(BAD, match=r"argument 'out_rows' = 200"):
            mxmoe.quantize_grouped(x, off, 200)
        with pytest.raises(BAD, match=r"argument 'padded_offsets' must have shape"):
            mxmoe.quantize_grouped(x, off, 256, padded_offsets=off[:2].clone())
        with pytest.raises(BAD, match=r"'row_index.shape\[0\]' = 100"):
            mxmoe.quantize_gather(x, torch.zeros(100, dtype=torch.int32, device=self.dev))
        with pytest.raises(BAD, match=r"argument 'rows_used'"):
            mxmoe.quantize_gather(x, torch.zeros(128, dtype=torch.int32, device=self.dev),
                                  rows_used=torch.zeros(2, dtype=torch.int32, device=self.dev))

    def test_moe_plan(self):
        with pytest.raises(BAD, match=r"argument 'ids' must have dtype Int"):
            mxmoe.moe_plan(torch.zeros(4, 2, dtype=torch.int64, device=self.dev), 4)
        with pytest.raises(BAD, match=r"'ids.shape\[1\]' = 5"):
            mxmoe.moe_plan(torch.zeros(4, 5, dtype=torch.int32, device=self.dev), 4)
        with pytest.raises(BAD, match=r"argument 'capacity' = 128"):
            mxmoe.moe_plan(torch.zeros(400, 2, dtype=torch.int32, device=self.dev), 4, capacity=128)

    def test_gemm(self):
        q = mxmoe.quantize(self.x(256, 128), fast=True).rowwise
        w = mxmoe.quantize(self.x(2, 64, 128), fast=True).rowwise
        off = torch.tensor([0, 128, 256], dtype=torch.int32, device=self.dev)
        y = mxmoe.grouped_gemm(q, w, off)
        assert y.shape == (256, 64)
        with pytest.raises(BAD, match=r"argument 'offsets' must have dtype Int"):
            mxmoe.grouped_gemm(q, w, off.long())
        with pytest.raises(BAD, match=r"argument 'offsets' must have shape \[3\]"):
            mxmoe.grouped_gemm(q, w, off[:2].clone())
        with pytest.raises(BAD, match=r"argument 'a_scales' must have shape"):
            mxmoe.grouped_gemm(q._replace(fast_scales=q.fast_scales[:, :128].contiguous()), w, off)
        with pytest.raises(BAD, match=r"argument 'a' must have dtype Float8_e4m3fn"):
            mxmoe.grouped_gemm(q._replace(fast_data=q.fast_data.view(torch.uint8)), w, off)
        with pytest.raises(BAD, match=r"argument 'b' must be \[E, N, K\]"):
            w2 = mxmoe.quantize(self.x(2, 64, 256), fast=True).rowwise
            mxmoe.grouped_gemm(q, w2, off)
        with pytest.raises(BAD, match=r"'a.shape\[0\]' = 192"):
            q192 = mxmoe.quantize(self.x(192, 128), fast=True).rowwise
            mxmoe.grouped_gemm(q192, w, off)
        with pytest.raises(BAD, match=r"argument 'a' has no fast form"):
            mxmoe.grouped_gemm(mxmoe.quantize(self.x(256, 128)).rowwise, w, off)
        with pytest.raises(BAD, match=r"argument 'out' must have dtype"):
            mxmoe.grouped_gemm(q, w, off, out=torch.empty(256, 64, dtype=torch.float16, device=self.dev))
        with pytest.raises(BAD, match=r"argument 'out' must have shape"):
            mxmoe.grouped_gemm(q, w, off, out=torch.empty(256, 32, dtype=torch.bfloat16, device=self.dev))
        with pytest.raises(BAD, match=r"output dtype must be"):
            mxmoe.grouped_gemm(q, w, off, out_dtype=torch.float16)
        with pytest.raises(BAD, match=r"argument 'b' must be a CUDA tensor"):
            mxmoe.grouped_gemm(q, w._replace(fast_data=w.fast_data.cpu()), off)
        # exact mode's images: bfloat16 of the data's shape
        img = mxmoe.bf16_image(q)
        with pytest.raises(BAD, match=r"argument 'a_image' must have dtype BFloat16"):
            mxmoe.grouped_gemm(q, w, off, fast=False, a_image=img.float())
        with pytest.raises(BAD, match=r"argument 'b_image' must have shape"):
            mxmoe.grouped_gemm(q, w, off, fast=False, b_image=img)
        with pytest.raises(BAD, match=r"argument 'scales' must have shape"):
            torch.ops.mxmoe.dequantize_mxfp8_bf16(q.data, q.scales[:, :2].contiguous())
        with pytest.raises(BAD, match=r"'data.shape\[-1\]' = 48"):
            torch.ops.mxmoe.dequantize_mxfp8_bf16(q.data[:, :48].contiguous(), q.scales[:, :1].contiguous())

    def test_wgrad(self):
        qa = mxmoe.quantize(self.x(256, 64), rowwise=False, colwise=True, fast=True).colwise   # [64, 256]
        qb = mxmoe.quantize(self.x(256, 96), rowwise=False, colwise=True, fast=True).colwise   # [96, 256]
        off = torch.tensor([0, 128, 256], dtype=torch.int32, device=self.dev)
        assert mxmoe.grouped_gemm_wgrad(qa, qb, off).shape == (2, 64, 96)
        qc = mxmoe.quantize(self.x(128, 96), rowwise=False, colwise=True, fast=True).colwise  # [96, 128]
        with pytest.raises(BAD, match=r"argument 'b' must be \[K, M_total\]"):
            mxmoe.grouped_gemm_wgrad(qa, qc, off)
        with pytest.raises(BAD, match=r"argument 'b_scales' must have shape"):
            mxmoe.grouped_gemm_wgrad(qa, qb._replace(scales=qb.scales[:, :4].contiguous()), off, fast=False)

    def test_decode(self):
        x = self.x(2, 256)
        wr = self.x(16, 256)
        with pytest.raises(BAD, match=r"argument 'router_w' must be \[E, H\]"):
            mxmoe.decode_router(x, self.x(16, 128), 4)
        with pytest.raises(BAD, match=r"argument 'bias' must have shape"):
            mxmoe.decode_router(x, wr, 4, "sigmoid", bias=torch.zeros(8, device=self.dev))
        with pytest.raises(BAD, match=r"'params.n_groups'"):
            mxmoe.decode_router(x, wr, 4, "softmax", n_groups=2)
        with pytest.raises(BAD, match=r"argument 'scoring'"):
            mxmoe.decode_router(x, wr, 4, "relu")
        ids, _ = mxmoe.decode_router(x, wr, 4)
        w1 = mxmoe.quantize(self.x(16, 128, 256)).rowwise
        with pytest.raises(BAD, match=r"argument 'w1_scales' is required"):
            mxmoe.decode_gate_up(x, w1.data, ids)
        with pytest.raises(BAD, match=r"argument 'w1_scales' must be None for BF16"):
            mxmoe.decode_gate_up(x, self.x(16, 128, 256), ids, w1_scales=w1.scales)
        with pytest.raises(BAD, match=r"argument 'topk_ids' must be \[B, k\]"):
            mxmoe.decode_gate_up(x, w1.data, ids[:1].clone(), w1_scales=w1.scales)
        h = mxmoe.decode_gate_up(x, w1.data, ids, w1_scales=w1.scales)
        with pytest.raises(BAD, match=r"argument 'topk_weights' must have dtype Float"):
            mxmoe.decode_down(h, self.x(16, 256, 64), ids, torch.ones(2, 4, dtype=torch.float64, device=self.dev))
        with pytest.raises(BAD, match=r"argument 'h' must be \[B, S, I\] with S = top_k"):
            mxmoe.decode_down(h[:, :3].contiguous(), self.x(16, 256, 64), ids[:, :2].contiguous(),
                              torch.ones(2, 2, device=self.dev))
