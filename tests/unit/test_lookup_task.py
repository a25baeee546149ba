"""The secret-code lookup, the tool task of the learning bench and of
bench-service's agentic tenants: held out by construction, answerable only
through the code book, and a tasks file that ``marlaas check`` accepts."""

from __future__ import annotations

import json
import re

from areal_marlaas.bench.lookup_task import write_lookup_task
from areal_marlaas.cli import main as marlaas
from tests.support.paths import REPO


def read(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def key_of(row: dict) -> str:
    return row["messages"][-1]["content"].split()[-1].rstrip("?")


def test_keys_are_disjoint_and_each_answer_is_its_entry_s_code(tmp_path):
    sizes = write_lookup_task(tmp_path, 40, 10, seed=3)
    assert sizes == {"demo": 2, "train": 40, "eval": 10}
    train, held = read(tmp_path / "train.jsonl"), read(tmp_path / "eval.jsonl")
    book = {d["title"]: d["text"] for d in read(tmp_path / "corpus.jsonl")}
    demos = {m["content"].split()[-1].rstrip("?") for m in train[0]["messages"][:-1]
             if m["role"] == "user"}  # fmt: skip
    assert len(demos) == 2
    train_keys, held_keys = {key_of(r) for r in train}, {key_of(r) for r in held}
    assert len(train_keys) == 40 and len(held_keys) == 10
    assert not train_keys & held_keys and not demos & (train_keys | held_keys)
    for row in train + held:
        entry = book[key_of(row)]
        code = re.search(r"code (\d{4})", entry)
        assert code and row["answer"] == f"The code is {code.group(1)}."
        # The other numbers of the entry are not the code.
        assert len(re.findall(r"\d{4}", entry)) == 3
        # The answer is nowhere in the row but its answer field.
        assert code.group(1) not in json.dumps(row["messages"][-1])
    # The demonstrations show the server's reply and the right field's code.
    tool = [m for m in train[0]["messages"] if m["role"] == "tool"][0]["content"]
    shown = [m for m in train[0]["messages"] if m["role"] == "assistant"][1]
    first = re.search(r"code (\d{4})", tool.splitlines()[0])
    assert first and shown["content"] == f"The code is {first.group(1)}."


def test_the_tool_tasks_file_passes_check(tmp_path, monkeypatch, capsys, model_path):
    write_lookup_task(tmp_path, 20, 8, seed=0)
    monkeypatch.setenv("LOOKUP_DATA", str(tmp_path))
    monkeypatch.setenv("LOOKUP_URL", "http://127.0.0.1:9/tools/search")
    rc = marlaas(
        [
            "check",
            "--config",
            str(REPO / "configs" / "learning.yaml"),
            "tasks_file=tasks/learning_tools.yaml",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert out.out.strip().endswith("OK")
