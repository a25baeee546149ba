"""A tenant on host 1 (run inside it by the two-host service test): one job
through the official ``openai`` SDK, then a chat with its fine-tuned model;
prints what it saw as JSON.

    python -m tests.support.two_hosts_client PORT API_KEY
"""

from __future__ import annotations

import json
import sys
import time

import openai

from areal_marlaas.bench.service_load import arithmetic_lines
from tests.support.service_live import BASE, STRING_CHECK, method


def main(port: int, key: str) -> dict:
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0
    )
    f = client.files.create(
        file=("a.jsonl", arithmetic_lines(4, 3)), purpose="fine-tune"
    )
    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=f.id, method=method(STRING_CHECK)
    )
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job.id)
        if job.status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(2)
    out: dict = {"job": job.id, "status": job.status, "error": str(job.error)}
    if job.status == "succeeded" and job.fine_tuned_model:
        chat = client.chat.completions.create(
            model=job.fine_tuned_model,
            messages=[{"role": "user", "content": "What is 2 + 3?"}],
            max_tokens=8,
        )
        out |= {
            "fine_tuned_model": job.fine_tuned_model,
            "chat_model": chat.model,
            "answer": chat.choices[0].message.content,
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2])))
