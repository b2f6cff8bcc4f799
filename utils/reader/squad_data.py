"""The reader's training and dev examples: from SQuAD-format files (utils.files.squad) or a hub dataset, with a dev
set carved off by whole articles when no dev file is given."""

import logging
import random

import datasets

from utils.errors import UserError
from utils.files.folds import article_of, articles_of
from utils.files.squad import load_squad
from utils.reader.config import DataConfig

logger = logging.getLogger("qa-amp")


def split_by_article(examples: list[dict], dev_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Carve a dev set off by whole articles (title), so no paragraph is in both halves."""
    titles = sorted(articles_of(examples))
    if len(titles) < 2:
        raise UserError("--dev_split needs at least two articles (titles) in the train file")
    random.Random(seed).shuffle(titles)
    n_dev = min(len(titles) - 1, max(1, round(dev_fraction * len(titles))))
    dev_titles = set(titles[:n_dev])
    train = [ex for ex in examples if article_of(ex) not in dev_titles]
    dev = [ex for ex in examples if article_of(ex) in dev_titles]
    return train, dev


def load_train_and_dev(data_config: DataConfig, seed: int) -> tuple[list[dict], list[dict]]:
    """train_reader.py's training and dev examples: from the hub (dataset_name), or from train_file and
    validation_file (or the train file's articles split by dev_split, drawn with `seed`), cut to
    max_train/eval_samples."""
    c = data_config
    if c.dataset_name:  # hub datasets already use the flattened layout
        hub = datasets.load_dataset(c.dataset_name, c.dataset_config_name)
        train, dev = list(hub["train"]), list(hub["validation"])
        for ex in train + dev:
            ex["answers"] = {"text": list(ex["answers"]["text"]), "answer_start": list(ex["answers"]["answer_start"])}
    else:
        train, repaired = load_squad(c.train_file)
        if c.dev_split:
            train, dev = split_by_article(train, c.dev_split, seed)
        else:
            dev, repaired_dev = load_squad(c.validation_file)
            repaired += repaired_dev
        if repaired:
            logger.warning("repaired %d answer offsets that did not point at their answer text", repaired)
    if c.max_train_samples:
        train = train[: c.max_train_samples]
    if c.max_eval_samples:
        dev = dev[: c.max_eval_samples]
    return train, dev
