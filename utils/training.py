"""The one training loop shared by train_reader.py and train_dpr.py.

A script describes its model with a `Task` (how one batch becomes a loss, how to evaluate, how to
save and load weights) and hands it to `fit`, which owns everything else: gradient accumulation
(`accelerator.accumulate`), clipping on sync steps only (`accelerator.clip_grad_norm_` unscales fp16
gradients first), optimizer and LR-schedule steps sized in optimizer updates, fp16 steps skipped by
the loss scaler (counted, logged with the scale, and not advancing the schedule), periodic
evaluation with best-model keeping and early stopping, crash-safe checkpoints, exact mid-epoch
resume (`load_state` + `skip_first_batches`), progress bars and trackers.
"""

import abc
import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_scheduler

from utils.runtime import peak_memory_mb, replace_dir, resolve_resume, save_checkpoint, tracker_config

logger = logging.getLogger("qa-amp")


class Task(abc.ABC):
    """What the loop needs to know about a model. Subclasses implement compute_loss, evaluate, save, load."""

    tracker_project = "qa-amp"

    def compute_loss(self, model, batch) -> torch.Tensor:
        """Loss of one batch; used by the default train_step (a task that overrides train_step needn't)."""
        raise TypeError(f"{type(self).__name__} defines neither compute_loss nor train_step")

    def train_step(self, accelerator, model, batch) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss. Override for chunked
        backward passes (GradCache)."""
        loss = self.compute_loss(model, batch)
        accelerator.backward(loss)
        return loss.detach()

    @abc.abstractmethod
    def evaluate(self, model) -> dict:
        """Run evaluation; return a dict with at least 'metrics' (flat name -> float)."""
        ...

    @abc.abstractmethod
    def save(self, model, directory: str, state_dict: dict) -> None:
        """Write the unwrapped model with the full fp32 `state_dict` (from accelerator.get_state_dict, which
        gathers FSDP/DeepSpeed shards) to `directory`. Called on the main process only."""
        ...

    @abc.abstractmethod
    def load(self, model, directory: str) -> None:
        """Load weights written by `save` into the (unwrapped) model."""
        ...

    @staticmethod
    def samples_in(batch) -> int:
        return len(batch["input_ids"])

    @staticmethod
    def tokens_in(batch) -> int:
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        return int(mask.sum()) if mask is not None else 0


@dataclass
class LoopState:
    """Progress that is not in the model/optimizer/scheduler; checkpointed with them."""

    step: int = 0  # optimizer updates attempted (fp16 skipped updates included)
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    skipped_steps: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    stopped_early: bool = False
    samples_seen: int = 0  # training inputs (all processes) consumed
    train_seconds: float = 0.0  # wall time in training steps, evaluation and checkpoint saves excluded

    def state_dict(self):
        return dataclasses.asdict(self)

    def load_state_dict(self, state):
        for key, value in state.items():
            setattr(self, key, value)


def evaluate(task: Task, model) -> dict:
    """task.evaluate in eval mode without autograd (dropout off, no graph, fp32 outputs)."""
    model.eval()
    with torch.no_grad():
        return task.evaluate(model)


def evaluate_before_training(accelerator, args, task: Task, model, headline) -> dict | None:
    """The starting model's metrics, so the gain from training is visible (not when resuming)."""
    if not args.eval_before_training or args.resume_from_checkpoint:
        return None
    metrics = evaluate(task, model)["metrics"]
    accelerator.print("before training: " + headline(metrics))
    return metrics


def run_summary(accelerator, state: LoopState, final: dict, before: dict | None, samples_name: str) -> dict:
    """What eval_results.json records about a run, the same for both scripts."""
    return {"metrics": final["metrics"], "metrics_before_training": before, "updates": state.step,
            "skipped_fp16_updates": state.skipped_steps, "best_update": state.best_step,
            "stopped_early": state.stopped_early, "train_seconds": round(state.train_seconds, 1),
            f"train_{samples_name}_per_second": round(state.samples_seen / max(state.train_seconds, 1e-9), 2),
            "precision": accelerator.mixed_precision, "processes": accelerator.num_processes,
            "peak_memory_mb": peak_memory_mb(accelerator)}


def build_optimizer(model, args) -> torch.optim.Optimizer:
    """AdamW without decay on biases/LayerNorm. `foreach` (multi-tensor) on every device; `fused` on
    CUDA: the per-parameter Python loop of the default AdamW is a large share of a CPU step.
    With --freeze_word_embeddings the embedding matrices leave the optimizer (and get no gradient)."""
    if args.freeze_word_embeddings:  # every encoder inside (DPR has two), before the parameter groups are built
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                module.get_input_embeddings().weight.requires_grad_(False)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    on_cuda = next(model.parameters()).is_cuda
    return torch.optim.AdamW(groups, lr=args.learning_rate, fused=True if on_cuda else None,
                             foreach=None if on_cuda else True)


def plan_steps(args, batches_per_epoch: int, num_processes: int) -> tuple[int, int]:
    """(optimizer updates per epoch, total updates). Accelerate shards batches across processes and
    `accumulate` forces a sync at the end of each epoch, hence the ceilings."""
    local_batches = math.ceil(batches_per_epoch / num_processes)
    per_epoch = math.ceil(local_batches / args.gradient_accumulation_steps)
    total = args.max_train_steps or math.ceil(args.num_train_epochs * per_epoch)
    return per_epoch, total


def build_scheduler(optimizer, args, total_steps: int):
    """Sized in optimizer updates. Not passed to accelerator.prepare (which would step it once per process
    per update); the loop steps it itself after every update the loss scaler did not skip."""
    return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=int(args.warmup_ratio * total_steps),
                         num_training_steps=total_steps)


def fit(accelerator, args, task: Task, model, optimizer, scheduler, train_loader, batch_sampler,
        total_steps: int) -> tuple[LoopState, dict]:
    """Train `model` (already prepared) for `total_steps` updates. Returns the loop state and the final
    evaluation of the model left in place (the best one, if an earlier evaluation beat the last)."""
    state = LoopState()
    accelerator.register_for_checkpointing(scheduler, state)
    resume_path = resolve_resume(args)
    if resume_path:
        accelerator.load_state(resume_path)
        logger.info("resumed from %s at update %d (epoch %d, batch %d)", resume_path, state.step, state.epoch,
                    state.batch_in_epoch)
    if args.report_to != "none":
        accelerator.init_trackers(task.tracker_project, config=tracker_config(args))
    best_dir = os.path.join(args.output_dir, "best_model")
    log_path = os.path.join(args.output_dir, "train_log.jsonl")
    if not resume_path and accelerator.is_main_process and os.path.exists(log_path):
        os.remove(log_path)  # a fresh run starts a fresh log; a resumed one appends
    scaler = accelerator.scaler  # set only for fp16 on a GPU

    progress = tqdm(total=total_steps, initial=state.step, desc="train", dynamic_ncols=True,
                    disable=not accelerator.is_local_main_process)
    window = {"loss": 0.0, "micro": 0, "samples": 0, "tokens": 0, "t0": time.perf_counter()}
    num_epochs = math.ceil(total_steps / max(1, math.ceil(len(train_loader) / args.gradient_accumulation_steps)))
    model.train()
    tick = time.perf_counter()
    while state.step < total_steps and not state.stopped_early and state.epoch < num_epochs:
        batch_sampler.epoch = state.epoch
        loader = (accelerator.skip_first_batches(train_loader, state.batch_in_epoch)
                  if state.batch_in_epoch else train_loader)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = task.train_step(accelerator, model, batch)
                state.batch_in_epoch += 1
                window["loss"] += loss.float()  # a tensor: no device sync until the next log line
                window["micro"] += 1
                window["samples"] += task.samples_in(batch) * accelerator.num_processes
                state.samples_seen += task.samples_in(batch) * accelerator.num_processes
                window["tokens"] += task.tokens_in(batch) * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue
                if args.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            state.step += 1
            if accelerator.optimizer_step_was_skipped:
                # fp16 overflow: the scaler skipped this update and lowered its scale; the LR stays put.
                state.skipped_steps += 1
                logger.info("update %d skipped by the fp16 loss scaler (inf/nan gradients); scale now %.0f",
                            state.step, scaler.get_scale())
            else:
                scheduler.step()
            progress.update(1)
            state.train_seconds += time.perf_counter() - tick

            if state.step % args.logging_steps == 0 or state.step == total_steps:
                _log_window(accelerator, state, scheduler, window, scaler, progress, log_path)
            housekeeping = time.perf_counter()
            if args.eval_steps and state.step % args.eval_steps == 0 and state.step < total_steps:
                _evaluate_and_track(accelerator, args, task, model, state, best_dir)
                model.train()
            if args.checkpointing_steps and state.step % args.checkpointing_steps == 0:
                save_checkpoint(accelerator, args, state.step, state.state_dict())
            tick = time.perf_counter()
            window["t0"] += tick - housekeeping  # evaluation and checkpoints are not training time
            if state.step >= total_steps or state.stopped_early:
                break
        else:  # epoch finished
            state.epoch += 1
            state.batch_in_epoch = 0
    progress.close()

    final = _evaluate_and_track(accelerator, args, task, model, state, best_dir, final=True)
    if state.best_step is not None and state.best_step != state.step and os.path.isdir(best_dir):
        logger.info("restoring the best model (update %d, %s=%.4f) over the last one", state.best_step,
                    args.metric_for_best_model, state.best_metric)
        task.load(accelerator.unwrap_model(model), best_dir)
        final = evaluate(task, model)
    return state, final


def _log_window(accelerator, state, scheduler, window, scaler, progress, log_path):
    loss = torch.as_tensor(window["loss"] / max(window["micro"], 1), device=accelerator.device)
    loss = accelerator.reduce(loss, reduction="mean").item()  # every process computes its own
    elapsed = time.perf_counter() - window["t0"]
    record = {"step": state.step, "epoch": state.epoch, "loss": round(loss, 5), "lr": scheduler.get_last_lr()[0],
              "window_s": round(elapsed, 3),
              "samples_per_s": round(window["samples"] / elapsed, 2), "tokens_per_s": round(window["tokens"] / elapsed),
              "skipped_steps": state.skipped_steps}
    if scaler is not None:
        record["loss_scale"] = scaler.get_scale()
    progress.set_postfix(loss=f"{loss:.4f}", lr=f"{record['lr']:.2e}", samples_s=record["samples_per_s"])
    accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
    if accelerator.is_main_process:
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
    window.update(loss=0.0, micro=0, samples=0, tokens=0, t0=time.perf_counter())


def _evaluate_and_track(accelerator, args, task, model, state, best_dir, final=False) -> dict:
    result = evaluate(task, model)
    metrics = result["metrics"]
    accelerator.log({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=state.step)
    accelerator.print(f"eval @ update {state.step}: " + " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    if args.metric_for_best_model not in metrics:
        return result
    value = metrics[args.metric_for_best_model]
    if state.best_metric is None or value > state.best_metric:
        state.best_metric, state.best_step, state.evals_without_improvement = value, state.step, 0
        if not final and args.eval_steps:  # only intermediate bests need a copy on disk
            state_dict = accelerator.get_state_dict(model)  # a collective under FSDP/DeepSpeed: every process
            if accelerator.is_main_process:
                task.save(accelerator.unwrap_model(model), best_dir + ".tmp", state_dict)
                replace_dir(best_dir + ".tmp", best_dir)
            accelerator.wait_for_everyone()
    elif not final:
        state.evals_without_improvement += 1
        if args.early_stopping_patience and state.evals_without_improvement >= args.early_stopping_patience:
            logger.info("early stopping: %d evaluations without improvement of %s", state.evals_without_improvement,
                        args.metric_for_best_model)
            state.stopped_early = True
    return result
