"""The optimizer and the learning-rate schedule: AdamW (fused where the device has the kernel), sized in optimizer
updates, and how to tell an update the fp16 loss scaler skipped."""

import torch
from transformers import PreTrainedModel, get_scheduler

from utils.loop.config import OptimizerConfig


def fused_adamw_supported(device: torch.device) -> bool:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # older torch: CUDA had fused AdamW first
        return device.type == "cuda"


def build_optimizer(model, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW without decay on biases/LayerNorm, fused (one kernel for all parameters) on the device the run
    trains on (`accelerator.device`; the model is still on the CPU here, prepare moves it), else foreach.
    With `freeze_word_embeddings` the embedding matrices leave the optimizer (and get no gradient)."""
    if config.freeze_word_embeddings:  # every encoder inside (DPR has two), before the parameter groups are built
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                module.get_input_embeddings().weight.requires_grad_(False)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = fused_adamw_supported(device)
    return torch.optim.AdamW(groups, lr=config.learning_rate, fused=True if fused else None,
                             foreach=None if fused else True)


def optimizer_name(optimizer) -> str:
    inner = optimizer
    while hasattr(inner, "optimizer"):  # Accelerate's wrapper, DeepSpeed's ZeRO optimizer
        inner = inner.optimizer
    defaults = getattr(inner, "defaults", {})
    impl = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"
    return f"{type(inner).__name__.lower()}_{impl}"


def build_scheduler(optimizer, config: OptimizerConfig, total_steps: int):
    """Sized in optimizer updates. Not passed to accelerator.prepare (which would step it once per process
    per update); the loop steps it itself after every update the loss scaler did not skip."""
    return get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=int(config.warmup_ratio * total_steps),
                         num_training_steps=total_steps)


def optimizer_step(optimizer, scaler) -> bool:
    """Step; return whether the fp16 loss scaler skipped the update (inf/NaN gradients).

    GradScaler lowers its scale exactly when it finds inf/NaN, whatever the optimizer. Accelerate's own
    `optimizer_step_was_skipped` instead watches whether `optimizer.step` was called, which a fused optimizer
    always is (the kernel skips internally), so it would read False on an overflow."""
    if scaler is None:  # no fp16, or DeepSpeed's own fp16 scaler (its wrapper reports the engine's overflow)
        optimizer.step()
        return bool(getattr(optimizer, "step_was_skipped", False))
    scale = scaler.get_scale()
    optimizer.step()
    return scaler.get_scale() < scale
