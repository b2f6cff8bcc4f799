"""The on-disk formats users load trained encoders in: sentence-transformers directories (each embeds exactly as
BiEncoder.embed) and transformers' DPRQuestionEncoder/DPRContextEncoder (what Haystack 1.x loads)."""

import json
import os

from torch import nn
from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder

from utils.retriever.bi_encoder import BiEncoder


def encoder_state(model: BiEncoder, state_dict: dict, side: str) -> dict:
    """The weights of one side's encoder out of the whole bi-encoder's state dict."""
    prefix = "query_encoder." if side == "query" or model.passage_encoder is None else "passage_encoder."
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def save_sentence_transformers_dir(encoder: nn.Module, state_dict: dict, tokenizer, directory: str, pooling: str,
                                   normalize: bool, max_seq_length: int) -> None:
    """A directory that loads in SentenceTransformer(dir) and AutoModel, embedding exactly as BiEncoder.embed."""
    # model.safetensors: transformers 5 writes no other format (its save_pretrained dropped safe_serialization,
    # and would silently swallow the argument).
    encoder.save_pretrained(directory, state_dict=state_dict)
    tokenizer.save_pretrained(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(directory, "2_Normalize"), exist_ok=True)
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    pooling_config = {"word_embedding_dimension": encoder.config.hidden_size,
                      "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
                      "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    for name, obj in (("modules.json", modules), ("1_Pooling/config.json", pooling_config),
                      ("sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})):
        with open(os.path.join(directory, name), "w") as f:
            json.dump(obj, f, indent=1)


def export_dpr(encoder: nn.Module, state_dict: dict, tokenizer, directory: str, side: str) -> None:
    """transformers' DPRQuestionEncoder / DPRContextEncoder (what Haystack 1.x loads). These pool the [CLS]
    token with no projection, so only a BERT encoder trained with CLS pooling exports faithfully."""
    bert = encoder.config.to_dict()
    keep = {k: bert[k] for k in DPRConfig().to_dict() if k in bert and k not in ("model_type", "architectures")}
    config = DPRConfig(**keep, projection_dim=0)
    dpr = DPRQuestionEncoder(config) if side == "query" else DPRContextEncoder(config)
    inner = dpr.question_encoder if side == "query" else dpr.ctx_encoder
    state = {k: v for k, v in state_dict.items() if not k.startswith("pooler.")}
    missing, unexpected = inner.bert_model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"DPR export: weights do not match (missing {missing}, unexpected {unexpected})")
    dpr.save_pretrained(directory)  # model.safetensors (see save_sentence_transformers_dir)
    tokenizer.save_pretrained(directory)
