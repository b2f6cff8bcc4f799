"""Build train.json and dev.json (SQuAD v2.0) from source.txt. Run from anywhere:
    python data/sample/build_sample.py
Answer offsets are the first occurrence of the answer text in its paragraph."""

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    splits, article = {"train": [], "dev": []}, None
    for n, line in enumerate(open(os.path.join(HERE, "source.txt"), encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        if line.startswith("= "):
            title, split = re.fullmatch(r"= (.+?) \| split: (train|dev)", line).groups()
            article = {"title": title, "paragraphs": []}
            splits[split].append(article)
        elif line.startswith("P: "):
            article["paragraphs"].append({"context": line[3:], "qas": []})
        elif line.startswith("Q: "):
            question, answer = (part.strip() for part in line[3:].split("||"))
            para = article["paragraphs"][-1]
            qid = (f"sample-{len(splits['train']) + len(splits['dev']):02d}-{len(article['paragraphs'])}-"
                   f"{len(para['qas']) + 1:02d}")
            if answer == "-":
                para["qas"].append({"id": qid, "question": question, "answers": [], "is_impossible": True})
                continue
            start = para["context"].find(answer)
            if start < 0:
                raise SystemExit(f"source.txt:{n}: answer {answer!r} is not in its paragraph")
            para["qas"].append({"id": qid, "question": question, "is_impossible": False,
                                "answers": [{"text": answer, "answer_start": start}]})
        else:
            raise SystemExit(f"source.txt:{n}: unrecognised line")
    for split, articles in splits.items():
        with open(os.path.join(HERE, f"{split}.json"), "w", encoding="utf-8") as f:
            json.dump({"version": "v2.0", "data": articles}, f, indent=1, ensure_ascii=False)
        qas = [q for a in articles for p in a["paragraphs"] for q in p["qas"]]
        print(f"{split}: {len(articles)} articles, {sum(len(a['paragraphs']) for a in articles)} paragraphs, "
              f"{len(qas)} questions, {sum(q['is_impossible'] for q in qas)} unanswerable")


if __name__ == "__main__":
    build()
