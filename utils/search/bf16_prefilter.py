"""The bf16 prefilter of the exact search: where bf16 products are fast, a block of vectors is first scored in bf16,
and only the queries whose best bf16 score could reach their cut, within a bound on the bf16 error, are scored in
fp32. The fp32 scores decide every result, so the search stays exact; the prefilter only skips products that
cannot change it."""

import torch

# |bf16 score - fp32 score| <= BF16_ERROR x |q| x |w|: inputs rounded to bf16 (2 x 2^-8 for a product), the fp32
# accumulation of 384-1024 products (< 1e-4) and the bf16 output (2^-8), with a margin.
BF16_ERROR = 0.0120


def bf16_prefilter_available(device) -> bool:
    """A bf16 product is only worth it where the hardware has it (AVX512-BF16/AMX CPUs). On CUDA fp32 is fast and
    cuBLAS may reduce bf16 products in bf16, which the error bound does not cover."""
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def may_reach(q_b: torch.Tensor, q_norm: torch.Tensor, w: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """The queries (rows of q_b, q in bf16) whose best bf16 score of the block w could, within the bf16 error
    bound, reach their cut; a NaN keeps its query (it is ranked in fp32)."""
    approx = (q_b @ w.bfloat16().T).amax(1).float()
    reach = approx + BF16_ERROR * q_norm * w.norm(dim=1).max()
    return torch.nonzero((reach >= cut) | torch.isnan(approx), as_tuple=True)[0]
