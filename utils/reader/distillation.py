"""Distilling a reader from a teacher (train_reader.py --teacher DIR; Hinton et al. 2015).

The student's loss is (1 - w) x the labels' loss + w x T^2 x KL(teacher || student) on the start and end
distributions at temperature T, per window or, under shared normalization, per question. With --distil_layers
"S:T,..." the run instead trains the student's layers (TinyBERT, Jiao et al. 2020): student layer S (0: the
embeddings) learns teacher layer T by hidden-state MSE, plus attention KL where the head counts match. A second run,
`--model_name_or_path <that run> --teacher DIR`, then distils the prediction layer.
"""

import functools
import hashlib
import os

import torch
from transformers import AutoConfig

from utils.errors import UserError
from utils.numeric import question_mean
from utils.reader.config import DistillationConfig
from utils.reader.shared_norm import NEG
from utils.reader.trained import ReaderSettings, check_reader_dir, load_qa_model
from utils.reader.windows import load_tokenizer

# Cased and accented letters, digits, punctuation and a long word: where two tokenizers that share a vocabulary can
# still split differently (lower-casing, accent stripping, pre-tokenisation)
PROBE = "Ångström's 1843 loom, at 50°C (İstanbul): non-déjà-vu élan — über-internationalization!"


def check_teacher(teacher: str, student_model: str, max_seq_length: int, doc_stride: int, max_query_length: int,
                  layer_pairs: tuple = (), student_layers: int | None = None, shared_norm: bool = False):
    """Raise a one-line UserError unless `teacher` is a trained reader the student can learn from: its tokenizer and
    recorded windows are the student's, it was trained with shared normalization if the student is (`shared_norm`;
    prediction layer only), and it has the layers `layer_pairs` name (`student_layers`: the student's count, None:
    `student_model`'s). A QA model without reader_settings.json counts as reading the student's windows, a window at
    a time."""
    check_reader_dir(teacher)
    if layer_pairs:
        have = (student_layers or AutoConfig.from_pretrained(student_model).num_hidden_layers,
                AutoConfig.from_pretrained(teacher).num_hidden_layers)
        for side, layer, count in ((side, pair[side], have[side]) for pair in layer_pairs for side in (0, 1)):
            if layer > count:
                raise UserError(f"--distil_layers: the {('student', 'teacher')[side]} has layers 0 to {count} "
                                f"(0: the embeddings), not {layer}")
    # A teacher that cuts text differently would teach positions that are other tokens.
    theirs, ours = load_tokenizer(teacher, max_seq_length), load_tokenizer(student_model, max_seq_length)
    if theirs.get_vocab() != ours.get_vocab() or theirs(PROBE)["input_ids"] != ours(PROBE)["input_ids"]:
        raise UserError(f"--teacher {teacher}: its tokenizer is not the student's ({student_model}): the positions it "
                        "teaches would be other tokens; give a teacher trained from the same tokenizer")
    recorded = ReaderSettings.load(teacher)
    # A window-level teacher's logits mean nothing across windows; only the prediction layer learns from them.
    if shared_norm and not (recorded and recorded.shared_norm) and not layer_pairs:
        why = ("it has no reader_settings.json, so it is read as a reader trained a window at a time"
               if recorded is None else "it was trained a window at a time")
        raise UserError(f"--teacher {teacher}: {why}, so its scores do not compare across the windows a question "
                        "reads; a student under --passages_per_question learns one distribution per question: give a "
                        "teacher trained with --passages_per_question")
    if recorded is None:  # another QA model: it reads the student's windows (nothing recorded says otherwise)
        return
    want = (max_seq_length, doc_stride, max_query_length)
    have = (recorded.max_seq_length, recorded.doc_stride, recorded.max_query_length)
    if have != want:
        raise UserError(f"--teacher {teacher}: it reads windows of max_seq_length/doc_stride/max_query_length "
                        f"{'/'.join(map(str, have))}, the student {'/'.join(map(str, want))}: give the student the "
                        "teacher's (--max_seq_length, --doc_stride, --max_query_length)")


def weights_hash(directory: str) -> str | None:
    """sha256 of a model directory's model.safetensors (None without one): which teacher it was."""
    path = os.path.join(directory, "model.safetensors")
    if not os.path.isfile(path):
        return None
    stat = os.stat(path)
    # Cached by size and mtime: hashed once per version of the file (the resume check and the run both ask).
    return _file_sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def distillation_kl(student: torch.Tensor, teacher: torch.Tensor, allowed: torch.Tensor, temperature: float,
                    group: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL(softmax(teacher / T) || softmax(student / T)) over the `allowed` positions (windows x positions): one
    distribution per question over all its windows (`group`: each window's question, 0..B-1), or per window (None)."""
    # `allowed` is never the question's tokens or [SEP]s: no answer starts there, and a teacher's logits there were
    # never trained (masked out under shared normalization) or were pushed to nothing by its labels.
    s = (student.float() / temperature).masked_fill(~allowed, NEG)  # masked after scaling: out at any T
    t = (teacher.float() / temperature).masked_fill(~allowed, NEG)
    if group is None:
        rows = [(s, t)]
    else:
        rows = [(s[group == g].reshape(1, -1), t[group == g].reshape(1, -1)) for g in range(int(group.max()) + 1)]
    total, count = s.new_zeros(()), 0
    for ss, tt in rows:
        log_s, log_t = torch.log_softmax(ss, dim=-1), torch.log_softmax(tt, dim=-1)
        total = total + (log_t.exp() * (log_t - log_s)).sum()
        count += ss.shape[0]
    return total / count


def fixed_on_resume(config: DistillationConfig | None) -> dict:
    """What a resumed run must share with this one (utils.loop.run's `fixed`): the teacher by its weights, its
    weight, temperature and layer pairs; a None teacher without one."""
    if config is None:
        return {"teacher": None}
    return {"teacher": {"model": config.teacher, "weights_sha256": weights_hash(config.teacher)},
            "distillation_weight": config.distillation_weight,
            "distillation_temperature": config.distillation_temperature, "distil_layers": config.distil_layers}


PROJECTION = "distil_projection"


class Teacher:
    """The teacher of a run: loaded once on the student's device, in eval mode, without gradients."""

    def __init__(self, accelerator, config: DistillationConfig):
        self.accelerator, self.config, self.layer_pairs = accelerator, config, config.layer_pairs
        # Outside the optimizer, DDP and the checkpoints: the teacher never changes.
        self.model = load_qa_model(config.teacher).to(accelerator.device).eval().requires_grad_(False)
        self.attention = False  # the intermediate stage matches attention too (`attach`)
        self.weights_sha256 = weights_hash(config.teacher)  # once: recorded with every save

    def attach(self, student) -> None:
        """For the intermediate stage, call before the optimizer is built: adds a projection of the student's hidden
        states to the teacher's width where they differ (trained with the student), and sets eager attention on both
        where their head counts match."""
        if not self.layer_pairs:
            return
        ours, theirs = student.config, self.model.config
        if ours.hidden_size != theirs.hidden_size:
            projection = torch.nn.Linear(ours.hidden_size, theirs.hidden_size)
            torch.nn.init.normal_(projection.weight, std=getattr(ours, "initializer_range", 0.02))
            torch.nn.init.zeros_(projection.bias)
            setattr(student, PROJECTION, projection.to(self.accelerator.device))
        self.attention = ours.num_attention_heads == theirs.num_attention_heads
        if self.attention:
            # The attention KL compares probabilities, which eager attention returns.
            student.set_attn_implementation("eager")
            self.model.set_attn_implementation("eager")

    def record(self) -> dict:
        """What reader_settings.json says of the teacher."""
        c = self.config
        return {"model": c.teacher, "weights_sha256": self.weights_sha256, "weight": c.distillation_weight,
                "temperature": c.distillation_temperature, "distil_layers": c.distil_layers}

    def intermediate_loss(self, model, inputs: dict, group: torch.Tensor | None = None) -> torch.Tensor:
        """The intermediate stage's loss: per window the layer pairs' hidden-state MSE and attention KL, each a mean
        over the window's tokens; the mean per question (`group`), then over questions."""
        out = model(**inputs, output_hidden_states=True, output_attentions=self.attention)
        with torch.no_grad(), self.accelerator.autocast():
            theirs = self.model(**inputs, output_hidden_states=True, output_attentions=self.attention)
        tokens = inputs["attention_mask"].float()
        per_token = tokens.new_zeros(tokens.shape)
        projection = getattr(getattr(model, "module", model), PROJECTION, None)
        for s, t in self.layer_pairs:
            hidden = out.hidden_states[s].float()
            if projection is not None:
                hidden = projection(hidden)
            per_token = per_token + ((hidden - theirs.hidden_states[t].float()) ** 2).mean(-1)
            if self.attention and s > 0 and t > 0:
                # MiniLM's form (KL of each head's, each token's distribution): transformers returns attention
                # probabilities, not TinyBERT's unnormalised scores.
                ps, pt = out.attentions[s - 1].float(), theirs.attentions[t - 1].float()  # windows x heads x q x k
                kl = (pt * (pt.clamp_min(1e-12).log() - ps.clamp_min(1e-12).log())).sum(-1)  # padded keys: 0
                per_token = per_token + kl.mean(1)
        per_window = (per_token * tokens).sum(1) / tokens.sum(1)
        # The answer heads join at weight 0 so that every parameter has a gradient (DDP reduces them all).
        tied = (out.start_logits.float().sum() + out.end_logits.float().sum()) * 0.0
        return question_mean(per_window, group) + tied

    def mixed(self, labels_loss: torch.Tensor, start: torch.Tensor, end: torch.Tensor, inputs: dict,
              allowed: torch.Tensor, group: torch.Tensor | None = None) -> torch.Tensor:
        """(1 - w) x `labels_loss` + w x T^2 x the mean of the start and end KLs against the teacher's logits on the
        same model `inputs`, over `allowed` (per question with `group`)."""
        # On the fly, not cached: under --passages_per_question a question's passages are drawn anew each epoch, and a
        # teacher in eval mode gives the same windows the same logits, all exact resume and 2 processes = 1 need.
        with torch.no_grad(), self.accelerator.autocast():
            out = self.model(**inputs)
        w, temperature = self.config.distillation_weight, self.config.distillation_temperature
        kl = (distillation_kl(start, out.start_logits, allowed, temperature, group)
              + distillation_kl(end, out.end_logits, allowed, temperature, group)) / 2
        # T^2 keeps the soft part's gradient on the scale of the labels' as T changes (Hinton et al.).
        return (1 - w) * labels_loss + w * temperature ** 2 * kl


def without_projection(state_dict: dict) -> dict:
    """A student's weights to save: the intermediate stage's projection left out (it served that run alone)."""
    return {k: v for k, v in state_dict.items() if not k.startswith(PROJECTION + ".")}
