"""`train_dpr.py --do_train false`: a trained retriever evaluated on any DPR file and corpus, ranking exactly as its
training run did (retriever_settings.json): dense, BM25, and the hybrid at the recorded dense weight, next to the
hybrid at a weight tuned on this very file (an upper bound). Several processes work: each encodes and searches its
shard of the corpus, or, with --index (index_corpus.py), searches its share of the index's shards, no process
holding all vectors."""

import os
from dataclasses import replace

import torch

from utils.errors import UserError
from utils.files.jsonfiles import json_line, write_json
from utils.index.config import CorpusConfig
from utils.index.index import Index
from utils.retriever.bi_encoder import bi_encoder_of
from utils.retriever.config import EncoderConfig, LossConfig, RetrieverEvaluationConfig
from utils.retriever.evaluation import EvaluationData, RetrievalEvaluation
from utils.retriever.settings import PASSAGE_ENCODER, QUERY_ENCODER, RetrieverSettings
from utils.runtime.flags import as_recorded
from utils.runtime.model_fingerprint import model_fingerprint
from utils.runtime.output_dir import publish_dir
from utils.runtime.process import bare_model, finish


def as_trained(model_dir: str | None, train_file: str | None, validation_file: str | None, output_dir: str,
               encoders: EncoderConfig, loss: LossConfig) -> tuple[EncoderConfig, LossConfig, str | None]:
    """--do_train false: the encoders and every ranking setting as the trained retriever of `model_dir` records
    them (the flags' own are not read), and the precision it ran at; its checks first."""
    if train_file:
        raise UserError("--do_train false only evaluates: drop --train_file")
    if not model_dir or not validation_file:
        raise UserError("--do_train false needs --model_name_or_path (a retriever trained by train_dpr.py) and "
                        "--validation_file")
    if os.path.abspath(output_dir) == os.path.abspath(model_dir):
        raise UserError("--output_dir is the retriever's directory: give another one, its eval_results.json and "
                        "rankings.jsonl would be overwritten")
    recorded = RetrieverSettings.load(model_dir)
    encoders = replace(as_recorded(encoders, recorded), query_model_name_or_path=os.path.join(model_dir, QUERY_ENCODER),
                       # one encoder serves both sides when shared (the run saved it under both names)
                       passage_model_name_or_path=os.path.join(model_dir, QUERY_ENCODER if recorded.shared_encoder
                                                               else PASSAGE_ENCODER))
    return encoders, as_recorded(loss, recorded), recorded.precision


def evaluate_retriever(accelerator, model_dir: str, output_dir: str, encoders: EncoderConfig,
                       config: RetrieverEvaluationConfig, corpus: CorpusConfig, q_tok, p_tok, data: EvaluationData,
                       batch_size: int, train_batch_size: int) -> None:
    """Rank `data` (`corpus`: where its passages came from, the passages or the index searched) with the retriever
    of `model_dir` (`encoders`: its encoders, as it records them), print the metrics and write eval_results.json
    and rankings.jsonl to `output_dir`. The batch sizes: as RetrievalEvaluation takes them."""
    settings = RetrieverSettings.load(model_dir)
    model = accelerator.prepare(bi_encoder_of(encoders))
    model.eval()
    index_shards, indexed, index_precision = None, 0, None
    if corpus.index:  # this process's share of the shards, checked against the retriever being evaluated
        index = Index.load(corpus.index, share=(accelerator.process_index, accelerator.num_processes))
        encoder = os.path.join(model_dir, QUERY_ENCODER if settings.shared_encoder else PASSAGE_ENCODER)
        index.check_encoder(os.path.abspath(model_dir), settings, model_fingerprint(encoder),
                            bare_model(accelerator, model).query_encoder.config.hidden_size, corpus.index)
        index_shards, indexed, index_precision = index.shards, index.count, index.built_by["precision"]
    evaluation = RetrievalEvaluation(accelerator, encoders, config, q_tok, p_tok, data, batch_size, train_batch_size,
                                     recorded_weight=settings.hybrid_dense_weight, index_shards=index_shards,
                                     indexed=indexed)
    with torch.no_grad():
        result = evaluation(model)
    m, questions, ranked = result["metrics"], len(data.questions), len(data.passages)
    accelerator.print(
        f"{config.validation_file}: {questions} questions, {ranked} passages; encoders at precision "
        f"{accelerator.mixed_precision}{' (as trained)' if accelerator.mixed_precision == settings.precision else ''}"
        + (f"; passages from the index {corpus.index} (embedded at {index_precision})" if corpus.index else "") + "\n"
        f"  dense:  top1 {m['top1']:.1f} top5 {m['top5']:.1f} top20 {m['top20']:.1f} MRR@10 {m['mrr@10']:.3f} "
        f"mean rank {m['mean_rank']:.1f}\n"
        f"  BM25:   top1 {m['bm25_top1']:.1f} top5 {m['bm25_top5']:.1f} top20 {m['bm25_top20']:.1f} MRR@10 "
        f"{m['bm25_mrr@10']:.3f}\n"
        f"  hybrid at the recorded dense weight {m['hybrid_recorded_dense_weight']}: top1 "
        f"{m['hybrid_recorded_top1']:.1f} top5 {m['hybrid_recorded_top5']:.1f} "
        f"MRR@10 {m['hybrid_recorded_mrr@10']:.3f}\n"
        f"  hybrid cross-fitted on this file (each half at the weight tuned on the other): top1 {m['hybrid_top1']:.1f} "
        f"MRR@10 {m['hybrid_mrr@10']:.3f}\n"
        f"  hybrid at the weight tuned on this file ({m['hybrid_tuned_dense_weight']}, an upper bound): top1 "
        f"{m['hybrid_tuned_top1']:.1f} MRR@10 {m['hybrid_tuned_mrr@10']:.3f}")
    with publish_dir(accelerator, output_dir, state="evaluated") as out:
        if accelerator.is_main_process:
            with open(os.path.join(out, "rankings.jsonl"), "w") as f:
                f.writelines(json_line(r) + "\n" for r in result["rankings"])
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"model": model_dir, "file": config.validation_file, "passages": corpus.passages,
                    "index": corpus.index, "index_precision": index_precision,
                    "corpus_passages": ranked, "metrics": m, "processes": accelerator.num_processes,
                    "precision": accelerator.mixed_precision, "precision_as_trained": settings.precision,
                    "note": "hybrid_*: cross-fitted on this file; hybrid_recorded_*: at the retriever's recorded dense "
                            "weight; hybrid_tuned_*: at the weight tuned on this file, an upper bound; rankings.jsonl: "
                            "hybrid_gold_rank at the recorded weight"})
    finish(accelerator)
