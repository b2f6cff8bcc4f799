"""The one training loop shared by train_reader.py and train_dpr.py.

A script reads its arguments and data, builds its model and a `Task` (utils.loop.task), prepares them with
Accelerate and calls `utils.loop.run.run`, which plans the updates and calls `fit`. `fit` owns the loop itself: gradient
accumulation (`accelerator.accumulate`), clipping on sync steps only (`accelerator.clip_grad_norm_` unscales fp16
gradients first), optimizer and LR-schedule steps sized in optimizer updates, fp16 updates skipped by the loss
scaler (counted, logged with the scale, not advancing the schedule), periodic evaluation with best-model keeping
and early stopping, crash-safe checkpoints, exact mid-epoch resume (`load_state` + `skip_first_batches`),
progress bars and trackers.
"""

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from utils.errors import Interrupted, UserError
from utils.files.jsonfiles import json_line
from utils.loop.checkpoints import (checkpoint_dir, list_checkpoints, replace_dir, resolve_resume, restore_best_model,
                                    save_checkpoint, supersede_later_checkpoints)
from utils.loop.config import LoopConfig
from utils.loop.optim import optimizer_step
from utils.loop.task import Task
from utils.runtime.atomic import atomic_file
from utils.runtime.process import bare_model, full_state_dict, tracker_config

logger = logging.getLogger("qa-amp")


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
        """Loss weight of micro-batch `batch_in_epoch`: k/r inside an epoch's last, partial accumulation group of r < k
        micro-batches (Accelerate syncs there, at the end of the loader), else 1."""
        full = self.batches_per_epoch - self.batches_per_epoch % accumulation
        return accumulation / (self.batches_per_epoch - full) if batch_in_epoch >= full else 1.0


def plan_steps(config: LoopConfig, train_loader) -> Plan:
    """Sized from the *prepared* loader: its len() is this process's share of the epoch as Accelerate shards
    it (rounded up with even batches, down with drop_last), so planned updates are the updates that run."""
    batches = len(train_loader)
    if batches == 0:
        raise UserError("no training batch per process: fewer training inputs than one batch per process")
    per_epoch = math.ceil(batches / config.gradient_accumulation_steps)
    total = config.max_train_steps or math.ceil(config.num_train_epochs * per_epoch)
    return Plan(batches, per_epoch, total, math.ceil(total / per_epoch))


def evaluate_without_grad(task: Task, model) -> dict:
    """task.evaluate in eval mode without autograd (dropout off, no graph, fp32 outputs)."""
    model.eval()
    with torch.no_grad():
        return task.evaluate(model)


def set_epoch(loader, epoch: int) -> None:
    """Give the batch sampler its epoch (its order is a function of seed and epoch). Accelerate's own set_epoch
    stops at its shard wrapper under DDP, so walk the chain of batch samplers."""
    while loader is not None:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        loader = getattr(loader, "batch_sampler", None)


def fit(accelerator, config: LoopConfig, task: Task, model, optimizer, scheduler, train_loader, plan: Plan,
        metrics_before_training: dict | None = None, hparams: dict | None = None,
        fixed: dict | None = None) -> tuple[LoopState, dict]:
    """Train `model` (already prepared) for `plan.total_updates` updates. Returns the loop state and the final
    evaluation of the model left in place (the best one, if an earlier evaluation beat the last). Ctrl-C ends it
    with one line that says where it stopped and how to resume (utils.errors.Interrupted). `hparams`: the run's
    settings as trackers record them; `fixed`: {flag: value} a resumed run must share with this one (what teaches
    it), recorded in every checkpoint."""
    state = LoopState(metrics_before_training=metrics_before_training)
    accelerator.register_for_checkpointing(scheduler, state, *task.checkpoint_objects())
    best_dir = os.path.join(config.output_dir, "best_model")
    log_path = os.path.join(config.output_dir, "train_log.jsonl")
    resume_path = resolve_resume(config.output_dir, config.resume_from_checkpoint)
    if resume_path:
        accelerator.load_state(resume_path)
        restore_best_model(accelerator, resume_path, best_dir, state.best_step)  # the one its state names
        logger.info("resumed from %s at update %d (epoch %d, batch %d)", resume_path, state.step, state.epoch,
                    state.batch_in_epoch)
        later = supersede_later_checkpoints(accelerator, config.output_dir, state.step)
        if later:
            logger.warning("resuming from update %d abandons the later checkpoints %s of this directory: moved to "
                           "%s (kept; 'latest' now continues this run)", state.step, ", ".join(later),
                           os.path.join(checkpoint_dir(config.output_dir), "superseded"))
        if accelerator.is_main_process:
            trim_log(log_path, state.step)  # the interrupted run logged updates that this run makes again
    elif config.resume_from_checkpoint:
        logger.info("--resume_from_checkpoint %s: no checkpoint yet, starting from scratch",
                    config.resume_from_checkpoint)
    if config.report_to != "none":
        accelerator.init_trackers(task.tracker_project, config=tracker_config(hparams or {}))
    if not resume_path and accelerator.is_main_process and os.path.exists(log_path):
        os.remove(log_path)  # a fresh run starts a fresh log; a resumed one appends
    progress = tqdm(total=plan.total_updates, initial=state.step, desc="train", dynamic_ncols=True,
                    disable=not accelerator.is_local_main_process)
    try:
        return _fit(accelerator, config, task, model, optimizer, scheduler, train_loader, plan, state, best_dir,
                    log_path, progress, fixed or {})
    except KeyboardInterrupt:
        progress.close()
        saved = list_checkpoints(checkpoint_dir(config.output_dir))
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
    with atomic_file(path) as f:
        f.writelines(kept)


def _fit(accelerator, config: LoopConfig, task, model, optimizer, scheduler, train_loader, plan, state, best_dir,
         log_path, progress, fixed):
    scaler = accelerator.scaler  # set only for fp16 (Accelerate's native AMP)
    total_steps, accumulation = plan.total_updates, config.gradient_accumulation_steps
    interval = LogInterval()
    model.train()
    tick = time.perf_counter()
    while state.step < total_steps and not state.stopped_early and state.epoch < plan.epochs:
        set_epoch(train_loader, state.epoch)
        task.epoch = state.epoch  # what this epoch's batches are (a task whose inputs are drawn per epoch reads it)
        if state.batch_in_epoch == 0:
            housekeeping = time.perf_counter()
            task.start_epoch(model, state.epoch)
            model.train()  # the hook may have switched to eval mode
            tick = time.perf_counter()
            interval.t0 += tick - housekeeping  # not training time (like evaluation)
        loader = (accelerator.skip_first_batches(train_loader, state.batch_in_epoch)
                  if state.batch_in_epoch else train_loader)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = task.train_step(accelerator, model, batch, plan.weight(state.batch_in_epoch, accumulation))
                state.batch_in_epoch += 1
                interval.loss += loss.float()
                interval.micro_batches += 1
                samples, tokens = (n * accelerator.num_processes
                                   for n in (task.samples_in(batch), task.tokens_in(batch)))
                interval.samples += samples
                interval.tokens += tokens
                state.samples_seen += samples
                state.tokens_seen += tokens
                if not accelerator.sync_gradients:
                    continue
                if config.max_grad_norm:
                    # Unscales fp16 gradients first; the norm is of the true (unscaled) gradient, inf on overflow.
                    norm = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    interval.grad_norm = norm if norm is not None else interval.grad_norm
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

            if state.step % config.logging_steps == 0 or state.step == total_steps:
                interval = log_interval(accelerator, state, scheduler, interval, scaler, progress, log_path)
            housekeeping = time.perf_counter()
            if state.step < total_steps:
                task.after_update(model, state.step)
                if config.eval_steps and state.step % config.eval_steps == 0:
                    _evaluate_and_track(accelerator, config, task, model, state, best_dir)
                model.train()  # the hook and evaluation may have switched to eval mode
            if config.checkpointing_steps and state.step % config.checkpointing_steps == 0:
                save_checkpoint(accelerator, config.output_dir, state.step, state.state_dict(), best_dir,
                                config.checkpoints_total_limit, fixed)
            tick = time.perf_counter()
            interval.t0 += tick - housekeeping  # evaluation and checkpoints are not training time
            if state.step >= total_steps or state.stopped_early:
                break
        else:  # epoch finished
            state.epoch += 1
            state.batch_in_epoch = 0
    progress.close()

    final = _evaluate_and_track(accelerator, config, task, model, state, best_dir, final=True)
    if state.best_step is not None and state.best_step != state.step:
        logger.info("restoring the best model (update %d, %s=%.4f) over the last one", state.best_step,
                    config.metric_for_best_model, state.best_metric)
        task.load(bare_model(accelerator, model), best_dir)
        final = evaluate_without_grad(task, model)
    return state, final


def improves(value: float, best: float | None, direction: str) -> bool:
    """Whether `value` beats the best so far in `direction` ("max" or "min"). NaN never does, and anything
    else beats a NaN best: a diverged evaluation must not become, or stay, the model that is kept."""
    if math.isnan(value):
        return False
    if best is None or math.isnan(best):
        return True
    return value > best if direction == "max" else value < best


@dataclass
class LogInterval:
    """What the updates since the last log line add up to (a training-log record averages over them)."""

    loss: float | torch.Tensor = 0.0  # a tensor while training: no device sync until the log line
    micro_batches: int = 0
    samples: int = 0
    tokens: int = 0
    grad_norm: float | torch.Tensor | None = None  # of the interval's last update, before clipping
    t0: float = dataclasses.field(default_factory=time.perf_counter)


def log_interval(accelerator, state, scheduler, interval: LogInterval, scaler, progress, log_path) -> LogInterval:
    """Write one training-log record (train_log.jsonl, trackers, the progress bar); return a fresh interval."""
    loss = torch.as_tensor(interval.loss / max(interval.micro_batches, 1), device=accelerator.device)
    loss = accelerator.reduce(loss, reduction="mean").item()  # every process computes its own
    elapsed = time.perf_counter() - interval.t0
    record = {"step": state.step, "epoch": state.epoch, "loss": round(loss, 5), "lr": scheduler.get_last_lr()[0],
              "window_s": round(elapsed, 3),
              "samples_per_s": round(interval.samples / elapsed, 2), "tokens_per_s": round(interval.tokens / elapsed),
              "skipped_steps": state.skipped_steps}
    if interval.grad_norm is not None:
        record["grad_norm"] = float(interval.grad_norm)
    if scaler is not None:
        record["loss_scale"] = scaler.get_scale()
    progress.set_postfix(loss=f"{loss:.4f}", lr=f"{record['lr']:.2e}", samples_s=record["samples_per_s"])
    accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
    if accelerator.is_main_process:
        with open(log_path, "a") as f:
            f.write(json_line(record) + "\n")
    return LogInterval()


def _evaluate_and_track(accelerator, config: LoopConfig, task, model, state, best_dir, final=False) -> dict:
    result = evaluate_without_grad(task, model)
    metrics = result["metrics"]
    accelerator.log({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=state.step)
    accelerator.print(f"eval @ update {state.step}: " + " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    value = metrics[config.metric_for_best_model]  # checked at start-up (Task.check_metric_for_best_model)
    if improves(value, state.best_metric, task.metric_directions[config.metric_for_best_model]):
        state.best_metric, state.best_step, state.evals_without_improvement = value, state.step, 0
        if not final and config.eval_steps:  # only intermediate bests need a copy on disk
            state_dict = full_state_dict(accelerator, model)  # a collective under FSDP/DeepSpeed: every process
            if accelerator.is_main_process:
                task.save(bare_model(accelerator, model), best_dir + ".tmp", state_dict)
                replace_dir(best_dir + ".tmp", best_dir)
            accelerator.wait_for_everyone()
    elif not final:
        state.evals_without_improvement += 1
        if config.early_stopping_patience and state.evals_without_improvement >= config.early_stopping_patience:
            logger.info("early stopping: %d evaluations without improvement of %s", state.evals_without_improvement,
                        config.metric_for_best_model)
            state.stopped_early = True
    return result
