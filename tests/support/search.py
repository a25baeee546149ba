"""The search agent's test pieces: a five-passage corpus, an engine that
replies with scripted turns, and the workflow built on them."""

from __future__ import annotations

import asyncio

from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest, ModelResponse

from areal_marlaas.tasks.search import search_prompt
from areal_marlaas.workflows.search_agent import SearchAgentWorkflow

CORPUS = [
    {"id": 0, "title": "Jaws (film)", "text": "Jaws is a 1975 thriller film "
     "directed by Steven Spielberg about a great white shark."},
    {"id": 1, "title": "Steven Spielberg", "text": "Steven Spielberg is an "
     "American filmmaker born in Cincinnati, Ohio."},
    {"id": 2, "title": "Eiffel Tower", "text": "The Eiffel Tower is a wrought-iron "
     "lattice tower in Paris, France."},
    {"id": 3, "title": "Great white shark", "text": "The great white shark is a "
     "species of large mackerel shark found in coastal waters."},
    {"id": 4, "title": "Cincinnati", "text": "Cincinnati is a city in Ohio on the "
     "Ohio River."},
]  # fmt: skip


class ScriptedEngine:
    """Returns fixed token ids per turn, like the server would."""

    def __init__(self, tokenizer, turns: list[str], version: int = 3):
        self.outputs = [tokenizer.encode(t, add_special_tokens=False) for t in turns]
        self.version = version
        self.requests: list[ModelRequest] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        out = self.outputs[len(self.requests)][: req.gconfig.max_new_tokens]
        self.requests.append(req)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=list(out),
            output_logprobs=[-0.25] * len(out),
            output_versions=[self.version] * len(out),
            stop_reason="stop",
        )


def make_workflow(tokenizer, corpus_path, **kw):
    gconfig = GenerationHyperparameters(max_new_tokens=kw.pop("budget", 400))
    return SearchAgentWorkflow(
        task="wiki",
        reward_fn="areal_marlaas.tasks.search.qa_em_reward_fn",
        gconfig=gconfig,
        tokenizer=tokenizer,
        corpus_path=str(corpus_path),
        top_k=kw.pop("top_k", 2),
        **kw,
    )


def row(question="Where was the director of Jaws born?", answer="Cincinnati"):
    return {
        "question": question,
        "answer": answer,
        "messages": [{"role": "user", "content": search_prompt(question)}],
    }


def run(workflow, engine, data):
    return asyncio.run(workflow.arun_episode(engine, data))
