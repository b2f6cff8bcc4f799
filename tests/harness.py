"""Test harness: run a project script with test-only instrumentation, as a real (torchrun-able) process.

    python tests/harness.py train_reader.py --mixed_precision fp16 ...

1. fp16 on the CPU through Accelerate's real path. Accelerate turns its fp16 machinery on for accelerators
   only (`Accelerator.__init__` sets `native_amp` and `scaler` for non-CPU devices), and the product refuses
   fp16 on a CPU for that reason. torch itself has CPU fp16 autocast and a CPU GradScaler, so an Accelerator
   whose `native_amp` and `scaler` are set before `prepare` runs the whole real path: autocast-wrapped forward,
   scaled backward, unscaling inside `clip_grad_norm_`, the scaler-driven optimizer step, and the scaler's
   state in `save_state`/`load_state`.
2. A record of the training batches each process really iterated (after Accelerate's sharding).

Only this file does these things; nothing in the product knows about them. Knobs (environment):
  FP16_CPU_INF_AT=3,8          put inf into the gradient of the first micro-batch of these (1-based) updates
  FP16_CPU_OPTIMIZER=fused|foreach   which AdamW implementation the run gets (default: the product's choice)
  FP16_CPU_GROWTH_INTERVAL=N   GradScaler growth interval (default 2000, torch's), small to exercise growth
  RECORD_BATCHES=DIR           append {"epoch", "indices"} of every training batch to DIR/rank<R>.jsonl
"""

import json
import os
import runpy
import sys

import accelerate
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import utils.loop.optim  # noqa: E402
import utils.runtime.process  # noqa: E402


class CPUFp16Accelerator(accelerate.Accelerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.mixed_precision == "fp16" and self.device.type == "cpu":
            self.native_amp = True
            self.scaler = torch.amp.GradScaler(
                "cpu", growth_interval=int(os.environ.get("FP16_CPU_GROWTH_INTERVAL", "2000")))
        self.inf_at = {int(x) for x in os.environ.get("FP16_CPU_INF_AT", "").split(",") if x}

    def backward(self, loss, **kwargs):
        super().backward(loss, **kwargs)
        if not self.inf_at:
            return
        # The training loop's own state says which update is being built: the same update in a resumed run.
        state = next(o for o in self._custom_objects if type(o).__name__ == "LoopState")
        first_micro_batch = state.batch_in_epoch % self.gradient_accumulation_steps == 0
        if state.step + 1 in self.inf_at and first_micro_batch:
            grad = next(p.grad for p in self._models[0].parameters() if p.grad is not None)
            grad.view(-1)[0] = float("inf")


def record_training_batches(directory):
    """Wrap BatchSamplerShard (what each process's loader iterates under DDP) to log the training batches."""
    from accelerate.data_loader import BatchSamplerShard

    from utils.runtime.batching import LengthGroupedBatchSampler

    iterate = BatchSamplerShard.__iter__

    def recording_iter(self):
        if not isinstance(self.batch_sampler, LengthGroupedBatchSampler):  # evaluation loaders
            yield from iterate(self)
            return
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"rank{self.process_index}.jsonl"), "a") as f:
            for batch in iterate(self):
                f.write(json.dumps({"epoch": self.batch_sampler.epoch, "indices": list(batch)}) + "\n")
                f.flush()
                yield batch

    BatchSamplerShard.__iter__ = recording_iter


def record_refreshed_negatives(directory):
    """Wrap DPRTask.refresh_negatives to log, per process, every question's negatives (text keys) after it."""
    from utils.files.corpus import text_key
    from utils.retriever.dpr_task import DPRTask

    refresh = DPRTask.refresh_negatives

    def recording(self, model, when):
        refresh(self, model, when)
        os.makedirs(directory, exist_ok=True)
        negatives = [[text_key(self.data.passages[j]) for j in row]
                     for row in self.data.question_passages[:, 1:].tolist()]
        with open(os.path.join(directory, f"rank{self.accelerator.process_index}.jsonl"), "a") as f:
            f.write(json.dumps({"when": when, "negatives": negatives}) + "\n")

    DPRTask.refresh_negatives = recording


utils.runtime.process.Accelerator = CPUFp16Accelerator
if os.environ.get("RECORD_BATCHES"):
    record_training_batches(os.environ["RECORD_BATCHES"])
if os.environ.get("RECORD_NEGATIVES"):
    record_refreshed_negatives(os.environ["RECORD_NEGATIVES"])
if os.environ.get("FP16_CPU_OPTIMIZER"):
    utils.loop.optim.fused_adamw_supported = lambda device: os.environ["FP16_CPU_OPTIMIZER"] == "fused"

if __name__ == "__main__":
    script = os.path.join(ROOT, sys.argv[1])
    sys.argv = [script] + sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
