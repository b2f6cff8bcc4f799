"""Index a corpus with a trained retriever (or BM25 alone), at DPR's scale: every process embeds its shard, written
as it goes.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python index_corpus.py --retriever outputs/dpr-squad --passages ../shared/data/dpr/passages.jsonl \
      --output_dir outputs/corpus-index
      Embeds the corpus exactly as the retriever ranks it (its sentence windows, titles, lengths, precision),
      chunk by chunk, and writes the index (utils/index/format.py) that qa_system.py --index, serve.py
      --index, train_dpr.py --do_train false --index and Index.load read where it lies.

  python index_corpus.py --retriever bm25 --passages corpus.jsonl --output_dir outputs/bm25-index
      An index of the passages and BM25 alone, no vectors (no trained retriever needed): built, resumed, updated,
      served and reloaded as a dense one, which qa_system.py and serve.py --retriever bm25 --index read.

  python index_corpus.py --retriever outputs/dpr-squad --documents my-docs/ --output_dir outputs/docs-index --watch 10
      A folder of documents read into the index's own corpus (as ingest_documents.py reads it, the same flags) and
      indexed; with --watch it stays running and updates the index whenever a document is added, changed or removed
      (by content, checked every 10 s), until SIGTERM or Ctrl-C, which stop it between updates
      (utils/index/watch.py).

  accelerate launch index_corpus.py ...        (on CPUs: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N ...)
      Each process embeds one contiguous shard of the corpus file (its byte range, cut at line starts) into its own
      shard files; the index is the same as one process's, vector for vector.

  Killed, run the same command again: each shard continues after its last complete chunk (what a chunk wrote past
  its recorded end is cut off), and the result equals an uninterrupted run's. A corpus or retriever that changed
  since, another dtype or another number of processes is refused, not mixed in.

  Run again on a complete index after the corpus changed (documents added, changed or removed, then
  ingest_documents.py again): the index is updated, not rebuilt. Passages whose title and text are unchanged keep
  their vectors bit for bit, only the others are embedded, and BM25 is built again where the index has it
  (utils/index/update.py). The new version is published in one rename and a running serve.py picks it up.
  The same corpus again: up to date, nothing written.

  The directory is locked while a run writes it: a second run on it meanwhile is refused. --overwrite_output_dir
  replaces an index, removing only what it wrote; a trained model's directory (the retriever's above all) is never
  replaced.

Skeleton: setup -> data (the corpus checked, shard by shard, before anything is written: every passage as the one
corpus loader checks it, every id unique across the whole corpus) -> the output directory -> embed (chunks of
--chunk_passages; it holds one chunk, whatever the corpus size) -> finish (the manifest, BM25 if asked).
"""

import logging
import os
from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import UserError, check_at_least_one, exit_on_user_error
from utils.files.documents import DocumentsConfig
from utils.index.config import RankedCorpusConfig
from utils.index.watch import keep_indexed
from utils.index.writer import BM25Only, build_index
from utils.retriever.retriever import Retriever
from utils.retriever.settings import RetrieverSettings
from utils.runtime.flags import arg, parse_args, process_group_timeout_arg
from utils.runtime.inference import InferenceConfig
from utils.runtime.output_dir import OutputConfig
from utils.runtime.process import finish, make_accelerator, peak_memory_mb
from utils.splitting import SplitConfig


@dataclass(frozen=True)
class IndexArgs(RankedCorpusConfig, InferenceConfig, OutputConfig):
    """The script's own flags, beside the shared ones it takes: the corpus and its retriever, how the encoder runs,
    the index directory to write (or to finish: the same command resumes it)."""
    dtype: Literal["float32", "float16"] = arg("float32", "How the vectors are stored: float16 halves the index for "
                                                          "scores within about 1e-3 of float32's.")
    chunk_passages: int = arg(4096, "Passages embedded and written at a time: the unit of resuming, and of memory.")
    bm25: Optional[bool] = arg(None, "Also build BM25 over the corpus, for the hybrid (it holds the corpus's terms "
                                     "in memory). Default: an update keeps what the index has; a new index has it "
                                     "when the retriever has a recorded hybrid weight.")
    watch: float = arg(0.0, "With --documents: stay running and bring the index up to date whenever a document is "
                            "added, changed or removed (by content), checked every this many seconds; SIGTERM or "
                            "Ctrl-C stops it between updates. 0: once.")
    process_group_timeout: int = process_group_timeout_arg()  # BM25 is built by the main process alone

    def __post_init__(self):
        if not self.retriever or not self.output_dir:
            raise UserError("give --retriever (a trained retriever, or bm25), the corpus (--passages, or "
                            "--documents) and --output_dir")
        RankedCorpusConfig.__post_init__(self)
        if self.index is not None:
            raise UserError("--index: index_corpus.py writes the index to --output_dir (the same directory again to "
                            "update it): give the corpus as --passages")
        if self.trained_retriever:
            RetrieverSettings.load(self.retriever)
        elif self.bm25 is False:
            raise UserError("--retriever bm25 --bm25 false: an index of BM25 alone needs its BM25")
        InferenceConfig.__post_init__(self)
        check_at_least_one(self, "chunk_passages", "process_group_timeout")
        if self.watch < 0:
            raise UserError(f"--watch must be 0 (once) or more seconds (got {self.watch})")


FLAGS = (IndexArgs, DocumentsConfig, SplitConfig)


def resolve(args: IndexArgs, reading: DocumentsConfig, split: SplitConfig):
    """The checks across the parsed configs, once: the corpus as passages or as documents, the watch with them."""
    if (args.passages is None) == (reading.documents is None):
        raise UserError("give the corpus as --passages (JSON lines) or as --documents (folders and files), one of them")
    if args.watch and not reading.documents:
        raise UserError("--watch keeps an index of --documents up to date: give --documents")
    out = os.path.realpath(args.output_dir)
    for given in map(os.path.realpath, reading.documents or []):
        if out == given or os.path.commonpath([given, out]) in (given, out):
            raise UserError(f"--output_dir {args.output_dir}: is one of the --documents, inside one or holds one "
                            "(the index would be read as a document, or replacing it would delete them)")
    return args, reading, split


@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args, reading, split = resolve(*parse_args(FLAGS, argv))
    # the encoder runs under its own autocast (utils.retriever.retriever)
    accelerator = make_accelerator(args.process_group_timeout)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    device = "cuda" if accelerator.device.type == "cuda" else "cpu"
    encoder = BM25Only() if args.retriever == "bm25" else Retriever(
        args.retriever, device=device, batch_size=args.batch_size, mixed_precision=args.mixed_precision)

    def report(meta):  # what a build did, where it built anything (else build_index said "up to date")
        if meta["seconds"] is not None:
            seconds, embedded = max(meta["seconds"], 1e-3), meta["embedded"]
            accelerator.print(f"indexed {meta['passages']} passages ({meta['vectors']} vectors) in {seconds:.1f} s: "
                              f"{embedded} passages embedded ({embedded / seconds:.1f} passages/s), the other "
                              f"{meta['passages'] - embedded} passages' vectors kept; peak memory "
                              f"{peak_memory_mb(accelerator)} MB on the first process")

    # --- data, embed, finish: utils/index/writer.py (the corpus checked before anything is written); with
    # --documents their corpus read first, and again whenever they change (--watch: utils/index/watch.py) -----
    build = dict(dtype=args.dtype, chunk_passages=args.chunk_passages, bm25=args.bm25)
    if reading.documents:
        keep_indexed(accelerator, encoder, reading, split, args.output_dir, args.watch, report,
                     args.overwrite_output_dir, **build)
    else:
        report(build_index(accelerator, encoder, args.passages, args.output_dir, overwrite=args.overwrite_output_dir,
                           **build))
    finish(accelerator)


if __name__ == "__main__":
    main()
