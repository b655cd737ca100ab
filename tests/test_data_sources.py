"""Problems from files as users keep them (``rstar2.problems``): JSON Lines, JSON, parquet and a
`datasets` folder, columns found or mapped (verl's layout among them), and errors that name the
file and the column. The tests write their own small files."""

from __future__ import annotations

import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rstar2.config import Columns
from rstar2.config_files import ConfigError, parse_config
from rstar2.problems import check_source, load_problems, source_name, training_problems

from .conftest import ROOT, RSTAR2

VERL_ROWS = [
    {
        "data_source": "dapo",
        "prompt": [
            {"role": "system", "content": "Think step by step."},
            {"role": "user", "content": f"What is {i} times 7?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(7 * i)},
        "extra_info": {"index": i},
    }
    for i in range(1, 4)
]


def test_verl_parquet_is_read_without_being_told_its_layout(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), path)
    rows = load_problems(str(path))
    assert [r["problem"] for r in rows] == ["What is 1 times 7?", "What is 2 times 7?", "What is 3 times 7?"]
    assert [r["answer"] for r in rows] == ["7", "14", "21"]
    assert rows[0]["data_source"] == "dapo"  # the other columns come along
    assert source_name(str(path)) == "train"


def test_columns_are_mapped_in_every_format(tmp_path):
    raw = [{"question_text": f"q{i}", "meta": {"gold": i * i}, "level": i} for i in range(4)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    (tmp_path / "a.json").write_text(json.dumps(raw))
    pq.write_table(pa.Table.from_pylist(raw), tmp_path / "a.parquet")
    columns = Columns(problem="question_text", answer="meta.gold")
    for name in ("a.jsonl", "a.json", "a.parquet"):
        rows = load_problems(str(tmp_path / name), columns)
        assert [(r["problem"], r["answer"], r["level"]) for r in rows] == [
            (f"q{i}", str(i * i), i) for i in range(4)
        ]


def test_a_datasets_folder_and_its_splits(tmp_path):
    import datasets

    train = datasets.Dataset.from_list([{"question": "1+1?", "solution_value": 2}])
    test = datasets.Dataset.from_list(
        [{"question": "2+2?", "solution_value": 4}, {"question": "3+3?", "solution_value": 6}]
    )
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    train.save_to_disk(str(tmp_path / "one"))
    rows = load_problems(str(tmp_path / "one"), Columns(answer="solution_value"))
    assert rows[0]["problem"] == "1+1?" and rows[0]["answer"] == "2"
    rows = load_problems(str(tmp_path / "dd"), Columns(answer="solution_value", split="test"))
    assert [r["answer"] for r in rows] == ["4", "6"]
    with pytest.raises(
        ValueError, match=r"holds the splits \['train', 'test'\]: name one with columns.split"
    ):
        load_problems(str(tmp_path / "dd"), Columns(answer="solution_value"))
    with pytest.raises(ValueError, match="no split 'dev'"):
        load_problems(str(tmp_path / "dd"), Columns(answer="solution_value", split="dev"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not one `datasets` saved"):
        load_problems(str(tmp_path / "plain"))


def test_errors_name_the_file_and_the_column(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "x", "solution": "y"}]), path)
    with pytest.raises(ValueError) as exc:
        load_problems(str(path))
    assert (
        str(path) in str(exc.value) and "for the answer" in str(exc.value) and "'solution'" in str(exc.value)
    )
    with pytest.raises(ValueError, match=r"no column 'gold' for the answer"):
        load_problems(str(path), Columns(answer="gold"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=f"{empty}: no problems in it"):
        load_problems(str(empty))
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        check_source("missing.jsonl")
    pq.write_table(pa.Table.from_pylist([{"problem": "x", "answer": [1, 2]}]), tmp_path / "list.parquet")
    with pytest.raises(ValueError, match=r"the answer's column holds \[1, 2\]"):
        load_problems(str(tmp_path / "list.parquet"))


def test_an_rl_config_reads_any_source_and_refuses_an_sft_config_with_columns(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), path)
    cfg = parse_config({"kind": "rl", "model": {"path": "m"}, "data": {"train": str(path), "limit": 2}})
    assert [r["answer"] for r in training_problems(cfg.data)] == ["7", "14"]
    with pytest.raises(ConfigError, match="give one of data.train"):
        parse_config({"kind": "rl", "model": {"path": "m"}, "data": {}})
    with pytest.raises(ConfigError, match="SFT config trains on data.train"):
        parse_config(
            {"kind": "sft", "model": {"path": "m"}, "data": {"train": "x", "columns": {"problem": "q"}}}
        )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_missing_paths_are_named_before_anything_starts(tmp_path, tiny_dir):
    """``rstar2 train`` and ``rstar2 eval`` name a path that does not exist, and start nothing."""
    import yaml

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    config = tmp_path / "rl.yaml"
    out = tmp_path / "run"
    tree = {
        "kind": "rl",
        "model": {"path": "/nonexistent"},
        "data": {"train": str(data)},
        "run": {"out": str(out)},
    }
    config.write_text(yaml.safe_dump(tree))
    run = subprocess.run(
        [*RSTAR2, "train", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    said = " ".join(run.stderr.split())
    assert run.returncode == 2 and "model.path: /nonexistent does not exist" in said, run.stderr[-2000:]
    assert not out.exists()  # nothing started
    tree["model"]["path"] = str(tiny_dir)
    tree["data"]["train"] = str(tmp_path / "missing.jsonl")
    config.write_text(yaml.safe_dump(tree))
    run = subprocess.run(
        [*RSTAR2, "train", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2 and "missing.jsonl does not exist" in " ".join(run.stderr.split())
    assert not out.exists()
    args = ["eval", "--model", str(tiny_dir), "--bench", "missing.jsonl", "--out", str(tmp_path / "e")]
    run = subprocess.run([*RSTAR2, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = " ".join(run.stderr.split())
    assert run.returncode == 2 and "missing.jsonl does not exist" in said and "no benchmark" not in said


def test_every_format_numbers_its_rows_from_one_and_a_broken_json_file_is_named(tmp_path):
    bad = [{"problem": "1 + 1", "answer": "2"}, {"q": "2 + 2", "a": "4"}]  # the second row lacks both
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    (tmp_path / "p.json").write_text(json.dumps(bad))
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "p.parquet")
    for name in ("p.jsonl", "p.json"):
        with pytest.raises(
            ValueError, match=r"\(row 2\): no column named 'problem' or 'question' or 'prompt'"
        ):
            load_problems(str(tmp_path / name))
    with pytest.raises(ValueError, match=r"p.parquet \(row 2\): the problem's column holds neither"):
        load_problems(str(tmp_path / "p.parquet"))  # parquet gives every row every column (None)
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "cut.json").write_text('[{"problem": ')
    with pytest.raises(ValueError, match=r"empty.json: not valid JSON \(an empty file\)"):
        check_source(str(tmp_path / "empty.json"))
    with pytest.raises(ValueError, match=r"cut.json: not valid JSON \(Expecting value at line 1 column 14\)"):
        check_source(str(tmp_path / "cut.json"))


def test_bad_input_is_said_by_name_before_a_model_loads_or_a_run_folder_is_written(tmp_path, tiny_dir):
    """Each exits 2 with one line naming the file, option or task, and no traceback; the model is
    never loaded (its loading bar never shows) and no run folder appears."""
    (tmp_path / "rows.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n{"q": "x"}\n')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "broken.yaml").write_text("kind: rl\nmodel: {path: x\n")
    rl = {"kind": "rl", "model": {"path": str(tiny_dir)}, "data": {"train": str(tmp_path / "rows.jsonl")}}
    rl["run"] = {"out": str(tmp_path / "run")}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(rl))
    eval_ = ["eval", "--model", str(tiny_dir), "--out", str(tmp_path / "e"), "--bench"]
    cases = {
        "empty.json: not valid JSON (an empty file)": [*eval_, str(tmp_path / "empty.json")],
        "task leg_counting refuses its config (sizee=3)": [*eval_, "gym:leg_counting?sizee=3"],
        "refuses its config (min_animals=9, max_animals=1): max_animals must be >= min_animals": [
            *eval_,
            "gym:leg_counting?min_animals=9&max_animals=1",
        ],
        "--column problem: give ROLE=COLUMN": [*eval_, str(tmp_path / "rows.jsonl"), "--column", "problem"],
        "rows.jsonl (row 2): no column named 'problem'": ["train", str(tmp_path / "rl.yaml")],
        'in "' + str(tmp_path / "broken.yaml"): ["train", str(tmp_path / "broken.yaml")],
        "the starting model is given 2 ways (model.path: /nonexistent, model.build: tiny)": [
            "demo",
            "--set",
            "model.path=/nonexistent",
            "--out",
            str(tmp_path / "demo"),
        ],
    }
    for said, args in cases.items():
        run = subprocess.run([*RSTAR2, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        out = " ".join(run.stderr.split()) + " ".join(run.stdout.split())
        assert run.returncode == 2 and said in out, (args, out[-2000:])
        assert "Traceback" not in out and "Loading weights" not in out, (args, out[-2000:])
    assert not any((tmp_path / d).exists() for d in ("run", "e", "demo"))


def test_an_evaluation_in_which_every_rollout_failed_says_why_and_exits_1(tmp_path, tiny_dir):
    """The tiny model's 2048 positions cannot hold this system prompt: no rollout gets a token, and
    ``rstar2 eval`` says so instead of reporting pass@1 0.0."""
    (tmp_path / "p.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    args = ["eval", "--model", str(tiny_dir), "--bench", str(tmp_path / "p.jsonl"), "-k", "2"]
    args += ["--out", str(tmp_path / "e"), "--system-prompt", "word " * 2100, "--no-progress"]
    run = subprocess.run([*RSTAR2, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = " ".join(run.stderr.split())
    assert run.returncode == 1, said[-2000:]
    assert "every one of the 2 rollouts failed, so nothing was measured" in said, said[-2000:]
    assert "leaves no room in the model's 2048 positions" in said and "Traceback" not in said
