"""Pieces of the shared training setup that change speed: frozen word embeddings, CPU malloc settings."""

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT
from transformers import AutoModelForQuestionAnswering

from utils.loop.checkpoints import load_weights
from utils.loop.config import OptimizerConfig
from utils.loop.optim import build_optimizer
from utils.retriever.bi_encoder import BiEncoder

CPU = torch.device("cpu")


def optimizer_args(freeze: bool):
    return OptimizerConfig(freeze_word_embeddings=freeze, weight_decay=0.01, learning_rate=1e-2)


def train_one_step(model, optimizer, loss_fn):
    loss_fn(model).backward()
    optimizer.step()


def test_frozen_word_embeddings_stay_put_while_the_rest_trains(tiny_bert_dir):
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, optimizer_args(freeze=True), CPU)
    ids = torch.randint(1000, 2000, (2, 12))
    train_one_step(model, optimizer, lambda m: m(input_ids=ids).start_logits.logsumexp(-1).sum())
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "bert.embeddings.word_embeddings.weight" not in changed
    assert {"bert.embeddings.position_embeddings.weight", "qa_outputs.weight",
            "bert.encoder.layer.0.attention.self.query.weight"} <= changed
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(model.get_input_embeddings().weight) not in in_optimizer


def test_without_the_flag_word_embeddings_train(tiny_bert_dir):
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    before = model.get_input_embeddings().weight.detach().clone()
    optimizer = build_optimizer(model, optimizer_args(freeze=False), CPU)
    ids = torch.randint(1000, 2000, (2, 12))
    train_one_step(model, optimizer, lambda m: m(input_ids=ids).start_logits.logsumexp(-1).sum())
    assert not torch.equal(model.get_input_embeddings().weight, before)


@pytest.mark.parametrize("shared", [False, True])
def test_freezing_reaches_both_encoders_of_a_bi_encoder(tiny_bert_dir, shared):
    model = BiEncoder.from_pretrained(tiny_bert_dir, tiny_bert_dir, shared=shared, pooling="mean", normalize=False)
    build_optimizer(model, optimizer_args(freeze=True), CPU)
    encoders = [model.query_encoder] + ([] if shared else [model.passage_encoder])
    assert all(not e.get_input_embeddings().weight.requires_grad for e in encoders)
    assert all(e.encoder.layer[0].output.dense.weight.requires_grad for e in encoders)


# The probe: allocate and free a 512 MiB tensor, then report how much of it the process still holds.
# glibc serves such a block with mmap and unmaps it on free; with the settings it comes from the heap
# and stays mapped, so the next step's identical allocation costs no page faults.
PROBE = textwrap.dedent("""
    import sys, resource
    sys.path.insert(0, {root!r})
    import torch
    from utils.runtime.process import keep_freed_memory
    if sys.argv[1] == "tuned":
        keep_freed_memory(torch.device("cpu"))
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20
    start = rss_mib()
    block = torch.ones(512 * 2**20 // 4)
    del block
    print(rss_mib() - start)
""")


def test_cpu_runs_keep_freed_memory_mapped_for_reuse():
    def held_after_free(mode):
        out = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT), mode], capture_output=True, text=True,
                             check=True)
        return float(out.stdout.strip())

    assert held_after_free("default") < 64  # unmapped at once
    assert held_after_free("tuned") > 448  # still mapped, ready for the next step


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_optimizer_is_fused_on_the_device_the_run_trains_on(tiny_bert_dir, device):
    """Chosen from accelerator.device: before prepare() the parameters are still on the CPU, so looking at them
    would never give a CUDA run the fused kernel."""
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    optimizer = build_optimizer(model, optimizer_args(freeze=False), torch.device(device))
    assert optimizer.defaults["fused"] is True and not optimizer.defaults["foreach"]


def test_restoring_weights_whose_names_do_not_fit_is_an_error_not_a_no_op(tiny_bert_dir, tmp_path):
    from safetensors.torch import save_file

    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    renamed = {f"_fsdp_wrapped_module.{k}": v.clone() for k, v in model.state_dict().items()}  # a wrapper's names
    save_file(renamed, str(tmp_path / "model.safetensors"))
    with pytest.raises(RuntimeError, match="missing"):
        load_weights(model, str(tmp_path / "model.safetensors"))
    save_file({k: v.clone() for k, v in model.state_dict().items()}, str(tmp_path / "same.safetensors"))
    load_weights(model, str(tmp_path / "same.safetensors"))


def test_grad_cache_under_deepspeed_is_refused():
    from accelerate.utils import DistributedType

    from train_dpr import FLAGS
    from utils.errors import UserError
    from utils.retriever.config import LossConfig
    from utils.runtime.flags import parse_args

    loss = parse_args(FLAGS, ["--grad_cache_chunk_size", "4"])[FLAGS.index(LossConfig)]
    loss.check_distributed(DistributedType.MULTI_GPU)
    with pytest.raises(UserError, match="does not work under DeepSpeed"):
        loss.check_distributed(DistributedType.DEEPSPEED)


def test_best_model_keeping_under_sharded_parameters_is_refused_at_start_up():
    from accelerate.utils import DistributedType

    from utils.errors import UserError
    from utils.runtime.process import check_layout

    check_layout(100, DistributedType.MULTI_GPU, None)
    check_layout(100, DistributedType.DEEPSPEED, 2)
    check_layout(None, DistributedType.FSDP, None)
    for layout, stage in ((DistributedType.FSDP, None), (DistributedType.DEEPSPEED, 3)):
        with pytest.raises(UserError, match="cannot be restored into FSDP/ZeRO-3"):
            check_layout(100, layout, stage)


def test_a_compiled_model_is_saved_under_its_own_weight_names():
    """--torch_compile: the compiled wrapper names every weight `_orig_mod.<name>`, and save_pretrained silently
    wrote nothing for names it did not know. full_state_dict gives the model's own names."""
    from accelerate import Accelerator

    from utils.runtime.process import full_state_dict

    accelerator = Accelerator(cpu=True)
    compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert set(accelerator.get_state_dict(compiled)) == {"_orig_mod.0.weight", "_orig_mod.0.bias"}
    assert set(full_state_dict(accelerator, compiled)) == {"0.weight", "0.bias"}


def test_best_model_keeping_follows_the_metrics_direction_and_never_keeps_nan():
    from utils.loop.fit import improves

    nan = float("nan")
    assert improves(0.5, None, "max") and improves(0.5, 0.4, "max") and not improves(0.4, 0.5, "max")
    assert improves(3.0, 4.0, "min") and not improves(4.0, 3.0, "min") and not improves(3.0, 3.0, "min")
    assert not improves(nan, None, "max") and not improves(nan, 1.0, "min") and improves(0.0, nan, "max")
