"""Reward functions of misbehaving tenants, named by import path in task
configs (a run's workers import them)."""

from __future__ import annotations

import time


def good_reward(prompt, completion, *args, **kwargs):
    return 1.0 if completion == "42" else 0.0


def raising_reward(*args, **kwargs):
    raise ValueError("tenant bug")


def hanging_reward(*args, **kwargs):
    time.sleep(600)


def text_reward(*args, **kwargs):
    return "high"
