"""The one training loop shared by train_reader.py and train_dpr.py.

A script reads its arguments and data, builds its model and a `Task` (how one batch becomes a loss, how to
evaluate, save, load and report), prepares them with Accelerate and calls `run`: the whole run from there on
(plan, schedule, evaluation of the starting model, `fit`, publishing the model with the task's outputs and
eval_results.json). `fit` owns the loop itself: gradient accumulation
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
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_scheduler

from utils.errors import Interrupted, UserError
from utils.output_dir import publish_dir
from utils.runtime import (bare_model, checkpoint_dir, finish, full_state_dict, json_line, list_checkpoints,
                           peak_memory_mb, replace_dir, restore_best_model, resolve_resume, save_checkpoint,
                           supersede_later_checkpoints, tracker_config, write_json)

logger = logging.getLogger("qa-amp")


class Task(abc.ABC):
    """What the loop needs to know about a model. Subclasses implement compute_loss, metric_directions, headline,
    evaluate, save and load; the rest has defaults."""

    tracker_project = "qa-amp"
    samples_name = "samples"  # what one training input is called in eval_results.json and the logs

    def model_inputs(self, batch):
        """What the training loader yielded -> the batch `compute_loss` takes (default: the same)."""
        return batch

    def compute_loss(self, model, batch):
        """Loss of one batch: a tensor, or (loss to backpropagate, loss to log) where they differ."""
        raise TypeError(f"{type(self).__name__} defines neither compute_loss nor train_step")

    def train_step(self, accelerator, model, batch, weight: float = 1.0) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss to log. `weight` multiplies only
        the backpropagated loss: the loop passes k/r to the r < k micro-batches of an epoch's last, partial
        accumulation window (Accelerate divides every loss by k), so that update has full weight.
        Override for chunked backward passes (utils.grad_cache)."""
        loss = self.compute_loss(model, self.model_inputs(batch))
        backprop, logged = loss if isinstance(loss, tuple) else (loss, loss)
        accelerator.backward(backprop * weight if weight != 1.0 else backprop)
        return logged.detach()

    @property
    @abc.abstractmethod
    def metric_directions(self) -> dict[str, str]:
        """The metrics `evaluate` reports that --metric_for_best_model may name, each with its direction: "max"
        (higher is better) or "min". Counts and settings (a question count, a tuned threshold) are left out: they
        are neither better nor worse."""
        ...

    def check_metric_for_best_model(self, name: str) -> None:
        """At start-up, not after hours of training: a name the task never reports would silently switch
        best-model keeping and early stopping off."""
        if name not in self.metric_directions:
            raise UserError(f"--metric_for_best_model {name}: not a metric of this run; choose one of "
                            + ", ".join(self.metric_directions))

    @abc.abstractmethod
    def headline(self, metrics: dict) -> str:
        """The one line printed before and after training."""
        ...

    @abc.abstractmethod
    def evaluate(self, model) -> dict:
        """Run evaluation; return a dict with at least 'metrics' (flat name -> float)."""
        ...

    def write_outputs(self, directory: str, result: dict) -> None:
        """Write what the final evaluation produced besides metrics (predictions, rankings...) into `directory`.
        Called on the main process only."""

    def summary(self, result: dict) -> dict:
        """Task-specific entries of eval_results.json."""
        return {}

    @abc.abstractmethod
    def save(self, model, directory: str, state_dict: dict) -> None:
        """Write the unwrapped model with the full fp32 `state_dict` (from runtime.full_state_dict, which
        gathers FSDP/DeepSpeed shards) to `directory`. Called on the main process only."""
        ...

    @abc.abstractmethod
    def load(self, model, directory: str) -> None:
        """Load weights written by `save` into the (unwrapped) model."""
        ...

    def start_epoch(self, model, epoch: int) -> None:
        """Called when epoch `epoch` starts from its first batch (not when a run resumes inside it)."""

    def after_update(self, model, step: int) -> None:
        """Called after optimizer update `step` (before its evaluation and checkpoint; not after the last)."""

    def checkpoint_objects(self) -> list:
        """Task state that checkpoints must carry (objects with state_dict/load_state_dict)."""
        return []

    @staticmethod
    def samples_in(batch) -> int:
        return len(batch["input_ids"])

    @staticmethod
    def tokens_in(batch) -> int:
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        return int(mask.sum()) if mask is not None else 0


def load_weights(module: torch.nn.Module, path: str) -> None:
    """Load a safetensors file into `module`, every key accounted for. A lenient load would make restoring
    the best model a silent no-op if the names did not fit (a wrapper's renamed weights)."""
    loaded = load_file(path)
    missing, unexpected = module.load_state_dict(loaded, strict=False)
    # save_pretrained leaves out tied tensors (BART's embed_tokens share the shared embedding): a missing key
    # whose storage is a loaded key's was loaded with it.
    own = module.state_dict()
    loaded_storage = {own[k].data_ptr() for k in loaded if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded_storage]
    if missing or unexpected:
        raise RuntimeError(f"{path} does not fit {type(module).__name__}: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")


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
    tokens_seen: int = 0  # non-padding training tokens (all processes) consumed
    train_seconds: float = 0.0  # wall time in training steps, evaluation and checkpoint saves excluded
    metrics_before_training: dict | None = None  # the starting model's, carried to a resumed run's results

    def state_dict(self):
        return dataclasses.asdict(self)

    def load_state_dict(self, state):
        for key, value in state.items():
            setattr(self, key, value)


@dataclass(frozen=True)
class Plan:
    """How many updates the run makes, computed once from the prepared loader and used everywhere."""

    batches_per_epoch: int  # micro-batches this process iterates per epoch
    updates_per_epoch: int
    total_updates: int
    epochs: int

    def weight(self, batch_in_epoch: int, accumulation: int) -> float:
        """Loss weight of micro-batch `batch_in_epoch`: k/r inside an epoch's last, partial window of r < k
        micro-batches (Accelerate syncs there, at the end of the loader), else 1."""
        full = self.batches_per_epoch - self.batches_per_epoch % accumulation
        return accumulation / (self.batches_per_epoch - full) if batch_in_epoch >= full else 1.0


def plan_steps(args, train_loader) -> Plan:
    """Sized from the *prepared* loader: its len() is this process's share of the epoch as Accelerate shards
    it (rounded up with even batches, down with drop_last), so planned updates are the updates that run."""
    batches = len(train_loader)
    if batches == 0:
        raise UserError("no training batch per process: fewer training inputs than one batch per process")
    per_epoch = math.ceil(batches / args.gradient_accumulation_steps)
    total = args.max_train_steps or math.ceil(args.num_train_epochs * per_epoch)
    return Plan(batches, per_epoch, total, math.ceil(total / per_epoch))


def evaluate(task: Task, model) -> dict:
    """task.evaluate in eval mode without autograd (dropout off, no graph, fp32 outputs)."""
    model.eval()
    with torch.no_grad():
        return task.evaluate(model)


def evaluate_before_training(accelerator, args, task: Task, model) -> dict | None:
    """The starting model's metrics, so the gain from training is visible (not when resuming a checkpoint;
    `--resume_from_checkpoint latest` with no checkpoint yet is a fresh start and gets them)."""
    if not args.eval_before_training or resolve_resume(args):
        return None
    metrics = evaluate(task, model)["metrics"]
    accelerator.print("before training: " + task.headline(metrics))
    return metrics


def run(accelerator, args, task: Task, model, optimizer, train_loader) -> None:
    """Everything after `accelerator.prepare(model, optimizer, train_loader)`: plan the updates, evaluate the
    starting model, fit, then publish the model, the task's outputs and eval_results.json together."""
    task.check_metric_for_best_model(args.metric_for_best_model)
    plan = plan_steps(args, train_loader)  # from the prepared loader: this process's real share
    scheduler = build_scheduler(optimizer, args, plan.total_updates)
    before = evaluate_before_training(accelerator, args, task, model)
    state, final = fit(accelerator, args, task, model, optimizer, scheduler, train_loader, plan, before)
    accelerator.print("after training:  " + task.headline(final["metrics"]))
    summary = {**run_summary(accelerator, optimizer, plan, state, final, task.samples_name), **task.summary(final)}
    state_dict = full_state_dict(accelerator, model)  # every process: gathers FSDP/DeepSpeed shards
    with publish_dir(accelerator, args.output_dir) as tmp:
        if accelerator.is_main_process:
            task.save(bare_model(accelerator, model), tmp, state_dict)
            task.write_outputs(tmp, final)
            write_json(accelerator, os.path.join(tmp, "eval_results.json"), summary)
    accelerator.print(f"saved the model, its outputs and eval_results.json to {args.output_dir} "
                      f"({summary[f'train_{task.samples_name}_per_second']} train {task.samples_name}/s, "
                      f"{state.skipped_steps} skipped updates)")
    finish(accelerator)


def run_summary(accelerator, optimizer, plan: Plan, state: LoopState, final: dict, samples_name: str) -> dict:
    """What eval_results.json records about a run, the same for both scripts."""
    seconds = max(state.train_seconds, 1e-9)
    return {"metrics": final["metrics"], "metrics_before_training": state.metrics_before_training, "updates": state.step,
            "updates_planned": plan.total_updates, "skipped_fp16_updates": state.skipped_steps,
            "best_update": state.best_step, "stopped_early": state.stopped_early,
            "train_seconds": round(state.train_seconds, 1),
            f"train_{samples_name}_per_second": round(state.samples_seen / seconds, 2),
            "train_tokens_per_second": round(state.tokens_seen / seconds, 1),
            "precision": accelerator.mixed_precision, "optimizer": optimizer_name(optimizer),
            "processes": accelerator.num_processes, "peak_memory_mb": peak_memory_mb(accelerator)}


def fused_adamw_supported(device: torch.device) -> bool:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # older torch: CUDA had fused AdamW first
        return device.type == "cuda"


def build_optimizer(model, args, device: torch.device) -> torch.optim.Optimizer:
    """AdamW without decay on biases/LayerNorm, fused (one kernel for all parameters) on the device the run
    trains on (`accelerator.device`; the model is still on the CPU here, prepare moves it), else foreach.
    Fused is 6x faster than foreach on this project's CPU for MiniLM's 22.7M parameters (11 vs 62 ms a step).
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
    fused = fused_adamw_supported(device)
    return torch.optim.AdamW(groups, lr=args.learning_rate, fused=True if fused else None,
                             foreach=None if fused else True)


def optimizer_name(optimizer) -> str:
    inner = optimizer
    while hasattr(inner, "optimizer"):  # Accelerate's wrapper, DeepSpeed's ZeRO optimizer
        inner = inner.optimizer
    defaults = getattr(inner, "defaults", {})
    impl = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"
    return f"{type(inner).__name__.lower()}_{impl}"


def build_scheduler(optimizer, args, total_steps: int):
    """Sized in optimizer updates. Not passed to accelerator.prepare (which would step it once per process
    per update); the loop steps it itself after every update the loss scaler did not skip."""
    return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=int(args.warmup_ratio * total_steps),
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


def set_epoch(loader, epoch: int) -> None:
    """Give the batch sampler its epoch (its order is a function of seed and epoch). Accelerate's own set_epoch
    stops at its shard wrapper under DDP, so walk the chain of batch samplers."""
    while loader is not None:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        loader = getattr(loader, "batch_sampler", None)


def fit(accelerator, args, task: Task, model, optimizer, scheduler, train_loader, plan: Plan,
        metrics_before_training: dict | None = None) -> tuple[LoopState, dict]:
    """Train `model` (already prepared) for `plan.total_updates` updates. Returns the loop state and the final
    evaluation of the model left in place (the best one, if an earlier evaluation beat the last). Ctrl-C ends it
    with one line that says where it stopped and how to resume (utils.errors.Interrupted)."""
    state = LoopState(metrics_before_training=metrics_before_training)
    accelerator.register_for_checkpointing(scheduler, state, *task.checkpoint_objects())
    best_dir = os.path.join(args.output_dir, "best_model")
    log_path = os.path.join(args.output_dir, "train_log.jsonl")
    resume_path = resolve_resume(args)
    if resume_path:
        accelerator.load_state(resume_path)
        restore_best_model(accelerator, resume_path, best_dir, state.best_step)  # the one its state names
        logger.info("resumed from %s at update %d (epoch %d, batch %d)", resume_path, state.step, state.epoch,
                    state.batch_in_epoch)
        later = supersede_later_checkpoints(accelerator, args, state.step)
        if later:
            logger.warning("resuming from update %d abandons the later checkpoints %s of this directory: moved to "
                           "%s (kept; 'latest' now continues this run)", state.step, ", ".join(later),
                           os.path.join(checkpoint_dir(args), "superseded"))
        if accelerator.is_main_process:
            trim_log(log_path, state.step)  # the interrupted run logged updates that this run makes again
    elif args.resume_from_checkpoint:
        logger.info("--resume_from_checkpoint %s: no checkpoint yet, starting from scratch", args.resume_from_checkpoint)
    if args.report_to != "none":
        accelerator.init_trackers(task.tracker_project, config=tracker_config(args))
    if not resume_path and accelerator.is_main_process and os.path.exists(log_path):
        os.remove(log_path)  # a fresh run starts a fresh log; a resumed one appends
    progress = tqdm(total=plan.total_updates, initial=state.step, desc="train", dynamic_ncols=True,
                    disable=not accelerator.is_local_main_process)
    try:
        return _fit(accelerator, args, task, model, optimizer, scheduler, train_loader, plan, state, best_dir,
                    log_path, progress)
    except KeyboardInterrupt:
        progress.close()
        saved = list_checkpoints(checkpoint_dir(args))
        if saved:
            where = f"the last checkpoint is {os.path.basename(saved[-1])}; resume with --resume_from_checkpoint latest"
        elif resume_path:
            where = f"no checkpoint since {resume_path}; resume with --resume_from_checkpoint {resume_path}"
        else:
            where = "no checkpoint was saved (--checkpointing_steps N saves one every N updates)"
        raise Interrupted(f"interrupted at update {state.step}; {where}") from None


def trim_log(path: str, step: int) -> None:
    """Keep the training log's records of updates up to `step` (a resumed run logs the later ones again)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)


def _fit(accelerator, args, task, model, optimizer, scheduler, train_loader, plan, state, best_dir, log_path,
         progress):
    scaler = accelerator.scaler  # set only for fp16 (Accelerate's native AMP)
    total_steps, accumulation = plan.total_updates, args.gradient_accumulation_steps
    window = {"loss": 0.0, "micro": 0, "samples": 0, "tokens": 0, "grad_norm": None, "t0": time.perf_counter()}
    model.train()
    tick = time.perf_counter()
    while state.step < total_steps and not state.stopped_early and state.epoch < plan.epochs:
        set_epoch(train_loader, state.epoch)
        if state.batch_in_epoch == 0:
            housekeeping = time.perf_counter()
            task.start_epoch(model, state.epoch)
            model.train()  # the hook may have switched to eval mode
            tick = time.perf_counter()
            window["t0"] += tick - housekeeping  # not training time (like evaluation)
        loader = (accelerator.skip_first_batches(train_loader, state.batch_in_epoch)
                  if state.batch_in_epoch else train_loader)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = task.train_step(accelerator, model, batch, plan.weight(state.batch_in_epoch, accumulation))
                state.batch_in_epoch += 1
                window["loss"] += loss.float()  # a tensor: no device sync until the next log line
                window["micro"] += 1
                samples, tokens = (n * accelerator.num_processes for n in (task.samples_in(batch), task.tokens_in(batch)))
                window["samples"] += samples
                window["tokens"] += tokens
                state.samples_seen += samples
                state.tokens_seen += tokens
                if not accelerator.sync_gradients:
                    continue
                if args.max_grad_norm:
                    # Unscales fp16 gradients first; the norm is of the true (unscaled) gradient, inf on overflow.
                    norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    window["grad_norm"] = norm if norm is not None else window["grad_norm"]
                skipped = optimizer_step(optimizer, scaler)
                optimizer.zero_grad(set_to_none=True)
            state.step += 1
            if skipped:
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
            if state.step < total_steps:
                task.after_update(model, state.step)
                if args.eval_steps and state.step % args.eval_steps == 0:
                    _evaluate_and_track(accelerator, args, task, model, state, best_dir)
                model.train()  # the hook and evaluation may have switched to eval mode
            if args.checkpointing_steps and state.step % args.checkpointing_steps == 0:
                save_checkpoint(accelerator, args, state.step, state.state_dict(), best_dir)
            tick = time.perf_counter()
            window["t0"] += tick - housekeeping  # evaluation and checkpoints are not training time
            if state.step >= total_steps or state.stopped_early:
                break
        else:  # epoch finished
            state.epoch += 1
            state.batch_in_epoch = 0
    progress.close()

    final = _evaluate_and_track(accelerator, args, task, model, state, best_dir, final=True)
    if state.best_step is not None and state.best_step != state.step:
        logger.info("restoring the best model (update %d, %s=%.4f) over the last one", state.best_step,
                    args.metric_for_best_model, state.best_metric)
        task.load(bare_model(accelerator, model), best_dir)
        final = evaluate(task, model)
    return state, final


def improves(value: float, best: float | None, direction: str) -> bool:
    """Whether `value` beats the best so far in `direction` ("max" or "min"). NaN never does, and anything
    else beats a NaN best: a diverged evaluation must not become, or stay, the model that is kept."""
    if math.isnan(value):
        return False
    if best is None or math.isnan(best):
        return True
    return value > best if direction == "max" else value < best


def _log_window(accelerator, state, scheduler, window, scaler, progress, log_path):
    loss = torch.as_tensor(window["loss"] / max(window["micro"], 1), device=accelerator.device)
    loss = accelerator.reduce(loss, reduction="mean").item()  # every process computes its own
    elapsed = time.perf_counter() - window["t0"]
    record = {"step": state.step, "epoch": state.epoch, "loss": round(loss, 5), "lr": scheduler.get_last_lr()[0],
              "window_s": round(elapsed, 3),
              "samples_per_s": round(window["samples"] / elapsed, 2), "tokens_per_s": round(window["tokens"] / elapsed),
              "skipped_steps": state.skipped_steps}
    if window["grad_norm"] is not None:  # of the window's last update, before clipping
        record["grad_norm"] = float(window["grad_norm"])
    if scaler is not None:
        record["loss_scale"] = scaler.get_scale()
    progress.set_postfix(loss=f"{loss:.4f}", lr=f"{record['lr']:.2e}", samples_s=record["samples_per_s"])
    accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
    if accelerator.is_main_process:
        with open(log_path, "a") as f:
            f.write(json_line(record) + "\n")
    window.update(loss=0.0, micro=0, samples=0, tokens=0, grad_norm=None, t0=time.perf_counter())


def _evaluate_and_track(accelerator, args, task, model, state, best_dir, final=False) -> dict:
    result = evaluate(task, model)
    metrics = result["metrics"]
    accelerator.log({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=state.step)
    accelerator.print(f"eval @ update {state.step}: " + " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    value = metrics[args.metric_for_best_model]  # checked at start-up (Task.check_metric_for_best_model)
    if improves(value, state.best_metric, task.metric_directions[args.metric_for_best_model]):
        state.best_metric, state.best_step, state.evals_without_improvement = value, state.step, 0
        if not final and args.eval_steps:  # only intermediate bests need a copy on disk
            state_dict = full_state_dict(accelerator, model)  # a collective under FSDP/DeepSpeed: every process
            if accelerator.is_main_process:
                task.save(bare_model(accelerator, model), best_dir + ".tmp", state_dict)
                replace_dir(best_dir + ".tmp", best_dir)
            accelerator.wait_for_everyone()
    elif not final:
        state.evals_without_improvement += 1
        if args.early_stopping_patience and state.evals_without_improvement >= args.early_stopping_patience:
            logger.info("early stopping: %d evaluations without improvement of %s", state.evals_without_improvement,
                        args.metric_for_best_model)
            state.stopped_early = True
    return result
