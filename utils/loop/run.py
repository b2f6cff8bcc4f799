"""`run`: everything a training script does after `accelerator.prepare(model, optimizer, train_loader)`: plan the
updates, evaluate the starting model, `fit` (utils.loop.fit), then publish the model, the task's outputs and
eval_results.json together (utils.runtime.output_dir)."""

import os

from utils.files.jsonfiles import write_json
from utils.loop.checkpoints import resolve_resume
from utils.loop.config import LoopConfig, OptimizerConfig
from utils.loop.fit import LoopState, Plan, evaluate_without_grad, fit, plan_steps
from utils.loop.optim import build_scheduler, optimizer_name
from utils.loop.task import Task
from utils.runtime.output_dir import publish_dir
from utils.runtime.process import bare_model, finish, full_state_dict, machine_kind, peak_memory_mb


def evaluate_before_training(accelerator, config: LoopConfig, task: Task, model) -> dict | None:
    """The starting model's metrics, so the gain from training is visible (not when resuming a checkpoint;
    `--resume_from_checkpoint latest` with no checkpoint yet is a fresh start and gets them)."""
    if not config.eval_before_training or resolve_resume(config.output_dir, config.resume_from_checkpoint):
        return None
    metrics = evaluate_without_grad(task, model)["metrics"]
    accelerator.print("before training: " + task.headline(metrics))
    return metrics


def run(accelerator, config: LoopConfig, task: Task, model, optimizer, train_loader, schedule: OptimizerConfig,
        hparams: dict, fixed: dict) -> None:
    """Everything after `accelerator.prepare(model, optimizer, train_loader)`: plan the updates, evaluate the
    starting model, fit, then publish the model, the task's outputs and eval_results.json together. `schedule`: the
    learning-rate schedule's settings; `hparams` and `fixed`: as `fit` takes them."""
    task.check_metric_for_best_model(config.metric_for_best_model)
    plan = plan_steps(config, train_loader)  # from the prepared loader: this process's real share
    scheduler = build_scheduler(optimizer, schedule, plan.total_updates)
    before = evaluate_before_training(accelerator, config, task, model)
    state, final = fit(accelerator, config, task, model, optimizer, scheduler, train_loader, plan, before, hparams,
                       fixed)
    accelerator.print("after training:  " + task.headline(final["metrics"]))
    summary = {**run_summary(accelerator, optimizer, plan, state, final, task.samples_name), **task.summary(final)}
    state_dict = full_state_dict(accelerator, model)  # every process: gathers FSDP/DeepSpeed shards
    with publish_dir(accelerator, config.output_dir) as tmp:
        if accelerator.is_main_process:
            task.save(bare_model(accelerator, model), tmp, state_dict)
            task.write_outputs(tmp, final)
            write_json(accelerator, os.path.join(tmp, "eval_results.json"), summary)
    accelerator.print(f"saved the model, its outputs and eval_results.json to {config.output_dir} "
                      f"({summary[f'train_{task.samples_name}_per_second']} train {task.samples_name}/s, "
                      f"{state.skipped_steps} skipped updates)")
    finish(accelerator)


def run_summary(accelerator, optimizer, plan: Plan, state: LoopState, final: dict, samples_name: str) -> dict:
    """What eval_results.json records about a run, the same for both scripts."""
    seconds = max(state.train_seconds, 1e-9)
    return {"metrics": final["metrics"], "metrics_before_training": state.metrics_before_training,
            "updates": state.step, "updates_planned": plan.total_updates, "skipped_fp16_updates": state.skipped_steps,
            "best_update": state.best_step, "stopped_early": state.stopped_early,
            "train_seconds": round(state.train_seconds, 1),
            f"train_{samples_name}_per_second": round(state.samples_seen / seconds, 2),
            "train_tokens_per_second": round(state.tokens_seen / seconds, 1),
            "precision": accelerator.mixed_precision, "optimizer": optimizer_name(optimizer),
            "processes": accelerator.num_processes, "peak_memory_mb": peak_memory_mb(accelerator),
            **machine_kind(accelerator.device)}

