"""The sorting kind: held out by problem, checked exactly."""

from __future__ import annotations

import pytest

from areal_marlaas.config import ConfigError
from areal_marlaas.config.tasks import TaskDatasetConfig, TaskSpec
from areal_marlaas.tasks import load_task_rows
from areal_marlaas.tasks.sorting import (
    held_out,
    make_sorting_rows,
    sorted_list_reward_fn,
)


def problems(rows: list[dict]) -> set[tuple[int, ...]]:
    return {tuple(int(x) for x in r["answer"].split(", ")) for r in rows}


def test_held_out_sorting_is_disjoint_by_problem_whatever_the_seeds():
    for seed_train, seed_test in ((1, 1), (1, 2), (7, 3)):
        train = make_sorting_rows(2000, 2, 3, seed_train, "train", 0.2)
        test = make_sorting_rows(300, 2, 3, seed_test, "test", 0.2)
        assert problems(train).isdisjoint(problems(test))
    # A problem is its set of numbers: any order lands on the same side.
    assert held_out([5, 40, 17], 0.2) == held_out([17, 5, 40], 0.2)


def test_sorting_rows_are_seeded_and_their_answers_sorted():
    rows = make_sorting_rows(50, 2, 4, 3)
    assert rows == make_sorting_rows(50, 2, 4, 3)
    for r in rows:
        shown = [int(x) for x in r["question"].split(": ")[1].split(", ")]
        assert len(set(shown)) == 4
        assert r["answer"] == ", ".join(map(str, sorted(shown)))


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("3, 17, 40", 1.0),
        ("Sorted from smallest to largest: 3, 17, 40.", 1.0),
        ("The numbers 40, 3, 17 sorted are 3, 17, 40", 1.0),
        ("3, 40, 17", 0.0),
        ("3, 17", 0.0),
        ("3, 17, 40, 41", 0.0),
        ("", 0.0),
    ],
)
def test_sorted_list_reward_checks_the_last_numbers(completion, reward):
    got = sorted_list_reward_fn("p", completion, [], [], answer="3, 17, 40")
    assert got == reward


def test_a_sorting_task_with_too_many_items_names_the_field():
    with pytest.raises(ConfigError, match=r"dataset\.items must be in \[2, 5\]"):
        TaskSpec(name="s", kind="sorting", dataset=TaskDatasetConfig(digits=1, items=6))
    spec = TaskSpec(
        name="s", kind="sorting", dataset=TaskDatasetConfig(items=3, size=4)
    )
    assert [len(r["answer"].split(", ")) for r in load_task_rows(spec)] == [3] * 4
