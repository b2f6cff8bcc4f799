"""The contract between the shared training loop (utils.loop.fit) and a task: how a batch becomes a loss, which
metrics it reports and in which direction they improve, how it evaluates, saves, loads and reports. The reader
(utils.reader.reader_task) and the DPR retriever (utils.retriever.dpr_task) are the two tasks."""

import abc

import torch

from utils.errors import UserError


class Task(abc.ABC):
    """What the loop needs to know about a model. Subclasses implement compute_loss, metric_directions, headline,
    evaluate, save and load; the rest has defaults."""

    tracker_project = "qa-amp"
    samples_name = "samples"  # what one training input is called in eval_results.json and the logs
    # the epoch whose batches are being trained: set by the loop before each epoch's batches, a resumed one's too
    epoch = 0

    def model_inputs(self, batch):
        """What the training loader yielded -> the batch `compute_loss` takes (default: the same)."""
        return batch

    def compute_loss(self, model, batch):
        """Loss of one batch: a tensor, or (loss to backpropagate, loss to log) where they differ."""
        raise TypeError(f"{type(self).__name__} defines neither compute_loss nor train_step")

    def train_step(self, accelerator, model, batch, weight: float = 1.0) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss to log. `weight` multiplies only
        the backpropagated loss: the loop passes k/r to the r < k micro-batches of an epoch's last, partial
        accumulation group (Accelerate divides every loss by k), so that update has full weight.
        Override for chunked backward passes (utils.loop.grad_cache)."""
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
        """Write the unwrapped model with the full fp32 `state_dict` (from utils.runtime.process.full_state_dict, which
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
